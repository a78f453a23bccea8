// te::hf::Tokenizer from files: the kind a path names (tokenizer.json, vocab.txt, a GGUF file), and
// from a GGUF file's tokenizer metadata (tokenizer.ggml.*), built as
// transformers 5.23.0 builds it (integrations/gguf/gguf_tokenizer_mapping.py: byte_level_tokenizer,
// add_gguf_special_tokens, set_split_regex): written as a tokenizer.json document and read by
// Tokenizer::from_json, so the pipeline has one home.

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <nlohmann/json.hpp>

#include "bpe.h"
#include "source.h"
#include "te/error.h"
#include "te/hf/gguf.h"
#include "te/hf/tokenizer.h"
#include "unicode.h"

namespace te::hf {

namespace fs = std::filesystem;

namespace {

using nlohmann::json;

// llama.cpp's pre-tokenizer names whose split transformers replaces GPT-2's with (the Llama 3
// pattern; GGUF_PRE_TOKENIZER_SPLITS). Other names keep ByteLevel's own GPT-2 split, as there.
const char kLlama3Split[] = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
                            R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kLlama3Names[] = {"llama3",       "llama-v3", "llama-bpe", "falcon3",
                                    "falcon-h1",    "pixtral",  "midm-2.0",  "lfm2",
                                    "jina-v5-nano", "dbrx",     "smaug-bpe"};

// The added tokens of a GGUF vocabulary: control tokens (type 3) spelled in the byte alphabet are
// special added tokens, user-defined ones (type 4) plain added tokens.
json added_tokens(const GgufValue& tokens, const GgufValue* types) {
  json added = json::array();
  if (types == nullptr) return added;
  for (std::size_t i = 0; i < types->integers.size() && i < tokens.strings.size(); ++i) {
    const int64_t type = types->integers[i];
    const bool in_bytes =
        detail::to_byte_level(detail::from_byte_level(tokens.strings[i])) == tokens.strings[i];
    if ((type == 3 && in_bytes) || type == 4) {
      added.push_back({{"id", i},
                       {"content", tokens.strings[i]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", type == 3}});
    }
  }
  return added;
}

// tokenizer.json's ByteLevel part (pre-tokenizer and decoder alike).
json byte_level_part() {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", false},
          {"trim_offsets", true},
          {"use_regex", true}};
}

// The pre-tokenizer transformers builds for llama.cpp's tokenizer.ggml.pre `name`: ByteLevel's
// GPT-2 split, or the Llama 3 split before ByteLevel without its own.
json pre_tokenizer(const std::string& name) {
  const bool llama3 = std::any_of(std::begin(kLlama3Names), std::end(kLlama3Names),
                                  [&](const char* n) { return name == n; });
  if (!llama3) return byte_level_part();
  json no_regex = byte_level_part();
  no_regex["use_regex"] = false;
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", kLlama3Split}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            no_regex}}};
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const std::string& path) {
  GgufFile file(path);
  auto fail = [&](const std::string& key, const std::string& message) {
    TE_FAIL("tokenizer: '", path, "': ", key, ": ", message);
  };
  const std::string model = file.string("tokenizer.ggml.model").value_or("");
  if (model != "gpt2") {
    fail("tokenizer.ggml.model", "'" + model +
                                     "' is not a tokenizer te-cpp builds from GGUF metadata "
                                     "(gpt2: byte-level BPE)");
  }
  const GgufValue* tokens = file.value("tokenizer.ggml.tokens");
  const GgufValue* merges = file.value("tokenizer.ggml.merges");
  if (tokens == nullptr || tokens->type != 9 || tokens->element_type != 8 ||
      tokens->strings.empty()) {
    fail("tokenizer.ggml.tokens", "is missing or not a non-empty list of strings");
  }
  if (merges == nullptr || merges->type != 9 || merges->element_type != 8 ||
      merges->strings.empty()) {
    fail("tokenizer.ggml.merges", "is missing or not a non-empty list of strings");
  }
  for (const std::string& m : merges->strings) {
    detail::utf8_to_code_points(m, "tokenizer: GGUF merge");
  }
  const GgufValue* types = file.value("tokenizer.ggml.token_type");
  if (types != nullptr && (types->type != 9 || types->strings.size() > 0 ||
                           types->integers.size() != tokens->strings.size())) {
    fail("tokenizer.ggml.token_type", "is not a list of one integer per token");
  }
  // Each token spelled in the byte alphabet (a token written in plain text is respelled).
  json vocab = json::object();
  std::vector<std::string> spelled;
  for (std::size_t i = 0; i < tokens->strings.size(); ++i) {
    const std::string& t = tokens->strings[i];
    detail::utf8_to_code_points(t, "tokenizer: GGUF token");
    const bool in_bytes = detail::to_byte_level(detail::from_byte_level(t)) == t;
    spelled.push_back(in_bytes ? t : detail::to_byte_level(t));
    if (vocab.contains(spelled.back())) {
      fail("tokenizer.ggml.tokens",
           "token " + std::to_string(i) + " '" + t + "' is token " +
               std::to_string(vocab[spelled.back()].get<std::size_t>()) +
               " again (spelled in the byte alphabet); each token must be spelled once");
    }
    vocab[spelled.back()] = i;
  }
  const json added = added_tokens(*tokens, types);
  const json byte_level = byte_level_part();
  const json pre = pre_tokenizer(file.string("tokenizer.ggml.pre").value_or(""));
  const json doc = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", pre},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair", json::array()},
        {"special_tokens", json::object()}}},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges->strings}, {"ignore_merges", false}}}};
  return from_json(doc.dump(), path + " (GGUF tokenizer metadata)");
}

Tokenizer Tokenizer::from_file(const std::string& path_text) {
  const fs::path path = path_text;
  const std::string name = path.filename().string();
  if (name == "vocab.txt") return from_vocab_txt(path_text);
  if (path.extension() == ".gguf") return from_gguf(path_text);
  TE_CHECK(path.extension() == ".json", "tokenizer: '", path_text,
           "' is neither a tokenizer.json, a vocab.txt nor a .gguf file; te-cpp reads those");
  return from_json_file(path_text);
}

Tokenizer Tokenizer::from_pretrained(const std::string& dir) {
  const fs::path d = dir;
  std::error_code ec;
  if (fs::exists(d / "tokenizer.json", ec)) return from_file((d / "tokenizer.json").string());
  if (fs::exists(d / "vocab.txt", ec)) return from_file((d / "vocab.txt").string());
  TE_FAIL("tokenizer: '", dir, "' holds neither tokenizer.json nor vocab.txt");
}

}  // namespace te::hf
