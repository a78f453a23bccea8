#include "te/hf/chat.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "json_fields.h"
#include "source.h"
#include "te/error.h"
#include "te/hf/gguf.h"

namespace te::hf {

namespace fs = std::filesystem;
using nlohmann::json;
using te::gen::check_sampling;
using te::gen::SamplingOptions;

namespace {

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  TE_CHECK(in.good(), "cannot read '", path.string(), "'");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// eos_token_id: an integer or a list of them.
void read_eos(const json& j, const std::string& file, std::vector<int64_t>& out) {
  if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) return;
  const json& e = j["eos_token_id"];
  out.clear();
  if (e.is_number_integer()) {
    out.push_back(e.get<int64_t>());
    return;
  }
  TE_CHECK(e.is_array(), "'", file, "': eos_token_id is not an integer or a list of them");
  for (const json& x : e) {
    TE_CHECK(x.is_number_integer(), "'", file, "': eos_token_id has a non-integer entry");
    out.push_back(x.get<int64_t>());
  }
}

// The sampling fields a model's file may set: SamplingOptions' name (generation_config.json's
// key too) and llama.cpp's GGUF key (src/llama-model.cpp, llama_model_meta_key_str).
struct SamplingKey {
  const char* field;
  const char* gguf;
};
constexpr SamplingKey kSamplingKeys[] = {{"temperature", "general.sampling.temp"},
                                         {"top_k", "general.sampling.top_k"},
                                         {"top_p", "general.sampling.top_p"},
                                         {"min_p", "general.sampling.min_p"},
                                         {"repetition_penalty", "general.sampling.penalty_repeat"}};

void set_sampling(GenerationDefaults& d, const std::string& field, double value,
                  const std::string& source) {
  SamplingOptions& s = d.sampling;
  if (field == "temperature") s.temperature = value;
  if (field == "top_k") {  // <= 0: off (llama.cpp); a count past any vocabulary keeps all
    s.top_k = !(value > 0) ? 0 : value >= 1e12 ? int64_t{1} << 40 : static_cast<int64_t>(value);
  }
  if (field == "top_p") s.top_p = value;
  if (field == "min_p") s.min_p = value;
  if (field == "repetition_penalty") s.repetition_penalty = value;
  d.sampling_sources.emplace_back(field, source);
}

void read_gguf_sampling(const GgufFile& file, GenerationDefaults& d) {
  for (const SamplingKey& k : kSamplingKeys) {
    if (auto v = file.number(k.gguf)) set_sampling(d, k.field, *v, k.gguf);
  }
  check_sampling(d.sampling, "'" + file.path() + "': general.sampling");
}

void read_json_sampling(const json& j, const std::string& file, GenerationDefaults& d) {
  const std::string name = fs::path(file).filename().string();
  for (const SamplingKey& k : kSamplingKeys) {
    if (!j.contains(k.field) || j[k.field].is_null()) continue;
    TE_CHECK(j[k.field].is_number(), "'", file, "': ", k.field, " is not a number");
    set_sampling(d, k.field, j[k.field].get<double>(), name);
  }
  // transformers' generate draws only with do_sample true: an explicit false is greedy. A file
  // that sets a temperature but no do_sample is read as asking for that temperature (transformers
  // would decode it greedily, warning that the temperature is unused).
  if (j.contains("do_sample") && j["do_sample"].is_boolean() && !j["do_sample"].get<bool>()) {
    set_sampling(d, "temperature", 0.0, name + ": do_sample false");
  }
  check_sampling(d.sampling, "'" + file + "'");
}

}  // namespace

SamplingOptions GenerationDefaults::llama_cpp_sampling() {
  SamplingOptions s;
  s.temperature = 0.8;
  s.top_k = 40;
  s.top_p = 0.95;
  s.min_p = 0.05;
  return s;
}

std::string describe_sampling(const GenerationDefaults& d) {
  const SamplingOptions& s = d.sampling;
  auto value = [&](const std::string& field) {
    char text[32];
    const double v = field == "temperature"          ? s.temperature
                     : field == "top_k"              ? static_cast<double>(s.top_k)
                     : field == "top_p"              ? s.top_p
                     : field == "min_p"              ? s.min_p
                     : field == "repetition_penalty" ? s.repetition_penalty
                     : field == "presence_penalty"   ? s.presence_penalty
                                                     : s.frequency_penalty;
    std::snprintf(text, sizeof text, "%g", v);
    return field + " " + text;
  };
  // Each field once, under the last source that set it; the sources in the order first seen.
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
  auto add = [&](const std::string& source, const std::string& field) {
    for (auto& [group_source, fields] : groups) {
      auto at = std::find(fields.begin(), fields.end(), field);
      if (at != fields.end()) fields.erase(at);
    }
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == source; });
    if (it == groups.end()) it = groups.insert(groups.end(), {source, {}});
    it->second.push_back(field);
  };
  for (const SamplingKey& k : kSamplingKeys) add("llama.cpp's defaults", k.field);
  for (const auto& [field, source] : d.sampling_sources) add(source, field);
  std::string out;
  for (const auto& [source, fields] : groups) {
    if (fields.empty()) continue;
    std::string part;
    for (const std::string& f : fields) part += (part.empty() ? "" : ", ") + value(f);
    out += (out.empty() ? "" : "; ") + part + " (" + source + ")";
  }
  return out;
}

GenerationDefaults read_generation_defaults(const std::string& dir_or_gguf) {
  GenerationDefaults d;
  if (detail::is_gguf(dir_or_gguf)) {
    GgufFile file(dir_or_gguf);
    if (auto eos = file.integer("tokenizer.ggml.eos_token_id")) d.eos_token_ids.push_back(*eos);
    if (auto eot = file.integer("tokenizer.ggml.eot_token_id")) {
      if (d.eos_token_ids.empty() || d.eos_token_ids[0] != *eot) d.eos_token_ids.push_back(*eot);
    }
    if (auto t = file.string("tokenizer.chat_template")) d.chat_template = *t;
    read_gguf_sampling(file, d);
    return d;
  }
  const fs::path dir(dir_or_gguf);
  std::error_code ec;
  // config.json first, generation_config.json over it (as transformers' generate reads them).
  for (const char* name : {"config.json", "generation_config.json"}) {
    const fs::path file = dir / name;
    if (!fs::exists(file, ec)) continue;
    const json j = detail::parse_json_object(read_text(file), file.string(), "generation");
    read_eos(j, file.string(), d.eos_token_ids);
    if (std::string(name) == "generation_config.json") read_json_sampling(j, file.string(), d);
  }
  const fs::path jinja = dir / "chat_template.jinja", config = dir / "tokenizer_config.json";
  if (fs::exists(jinja, ec)) {
    d.chat_template = read_text(jinja);
  } else if (fs::exists(config, ec)) {
    const json c = detail::parse_json_object(read_text(config), config.string(), "tokenizer");
    if (c.contains("chat_template") && c["chat_template"].is_string()) {
      d.chat_template = c["chat_template"].get<std::string>();
    }
  }
  return d;
}

}  // namespace te::hf
