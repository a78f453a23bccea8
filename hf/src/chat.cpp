#include "te/hf/chat.h"

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

namespace {

bool has(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

std::string trimmed(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\n\r");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t\n\r") - first + 1);
}

}  // namespace

ChatTemplate ChatTemplate::recognise(const std::string& jinja, const std::string& where) {
  ChatTemplate t;
  if (has(jinja, "<|im_start|>") && has(jinja, "<|im_end|>") &&
      has(jinja, "add_generation_prompt") && !has(jinja, "tools") && !has(jinja, "<think>")) {
    t.family_ = "chatml";
    // A default system message before a first message that is not one (SmolLM2's).
    const std::string opening = "'<|im_start|>system\n";
    const auto at = jinja.find(opening);
    if (has(jinja, "messages[0]['role'] != 'system'") && at != std::string::npos) {
      const auto begin = at + opening.size();
      const auto end = jinja.find("<|im_end|>", begin);
      TE_CHECK(end != std::string::npos, "chat template of ", where,
               ": its default system message has no end");
      t.default_system_ = jinja.substr(begin, end - begin);
      t.has_default_system_ = true;
    }
    return t;
  }
  if (has(jinja, "<|start_header_id|>") && has(jinja, "<|eot_id|>") &&
      has(jinja, "add_generation_prompt") && !has(jinja, "tools") &&
      !has(jinja, "Cutting Knowledge")) {
    t.family_ = "llama3";
    return t;
  }
  throw Error("chat template of " + where +
              " is not one te-cpp applies (it recognises ChatML and Llama 3 templates without "
              "tools; there is no Jinja engine): give the prompt as text instead of --chat");
}

std::string ChatTemplate::apply(const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) const {
  TE_CHECK(!messages.empty(), "chat template: no messages");
  for (const ChatMessage& m : messages) {
    TE_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant",
             "chat template: role '", m.role, "' is not system, user or assistant");
  }
  std::string out;
  if (family_ == "chatml") {
    if (has_default_system_ && messages.front().role != "system") {
      out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
    }
    for (const ChatMessage& m : messages) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    }
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
  }
  out = "<|begin_of_text|>";
  for (const ChatMessage& m : messages) {
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trimmed(m.content) +
           "<|eot_id|>";
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

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

}  // namespace

GenerationDefaults read_generation_defaults(const std::string& dir_or_gguf) {
  GenerationDefaults d;
  if (detail::is_gguf(dir_or_gguf)) {
    GgufFile file(dir_or_gguf);
    if (auto eos = file.integer("tokenizer.ggml.eos_token_id")) d.eos_token_ids.push_back(*eos);
    if (auto eot = file.integer("tokenizer.ggml.eot_token_id")) {
      if (d.eos_token_ids.empty() || d.eos_token_ids[0] != *eot) d.eos_token_ids.push_back(*eot);
    }
    if (auto t = file.string("tokenizer.chat_template")) d.chat_template = *t;
    return d;
  }
  const fs::path dir(dir_or_gguf);
  std::error_code ec;
  // config.json first, generation_config.json over it (as transformers' generate reads them).
  for (const char* name : {"config.json", "generation_config.json"}) {
    const fs::path file = dir / name;
    if (!fs::exists(file, ec)) continue;
    read_eos(detail::parse_json_object(read_text(file), file.string(), "generation"), file.string(),
             d.eos_token_ids);
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
