// te::hf::Tokenizer from files: the kind a path names (tokenizer.json, vocab.txt, a GGUF file), and
// from a GGUF file's tokenizer metadata (tokenizer.ggml.*), built as
// transformers 5.23.0 builds it (integrations/gguf/gguf_tokenizer_mapping.py: byte_level_tokenizer,
// add_gguf_special_tokens, set_split_regex): written as a tokenizer.json document and read by
// Tokenizer::from_json, so the pipeline has one home.

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>

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

// How text is split before byte-level BPE for each of llama.cpp's tokenizer.ggml.pre names: the
// regexes applied in turn (each isolates its matches within the pieces the previous left, as a
// tokenizer.json Sequence of Split pre-tokenizers does), then ByteLevel with or without GPT-2's
// own regex. The names and splits are llama.cpp's (src/llama-vocab.cpp, llama_vocab::impl::load
// and llm_tokenizer_bpe, at 0c1e570 as vendored by llama-cpp-python 0.3.36), with each family's
// original tokenizer.json regex where llama.cpp quotes it beside its adapted one: the models' own
// tokenizers, which llama.cpp's vocab test vectors hold (tests/interop/check_llama_cpp_vocab.py).
struct PreSplit {
  std::vector<const char*> names;
  std::vector<const char*> splits;
  bool gpt2_regex = false;     // ByteLevel's own regex after the splits
  bool ignore_merges = false;  // a word that is a token is taken whole (Llama 3's tokenizer.json)
};
const char kLlama3Split[] = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
                            R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char kGpt2Split[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
const std::vector<PreSplit>& pre_splits() {
  static const std::vector<PreSplit> kSplits = {
      {{"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
        "mellum", "modern-bert", "mpt", "olmo", "jais", "jina-v1-en", "jina-v2-code",
        "roberta-bpe"},
       {},
       true},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
        "jina-v5-nano"},
       {kLlama3Split},
       false,
       true},
      {{"dbrx", "smaug-bpe"}, {kLlama3Split}},
      {{"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2"},
       {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*)"
        R"(|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {{"qwen35"},
       {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N})"
        R"(| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      // (llama.cpp's character classes, written as code points.)
      {{"deepseek-llm"},
       {R"([\r\n])",
        R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293})"
        R"(\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386})"
        R"(\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F})"
        R"(\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA})"
        R"(\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15})"
        R"(\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B})"
        R"(\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4})"
        R"(\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4})"
        R"(\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124})"
        R"(\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F})"
        R"(\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
        R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F})"
        R"(\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17})"
        R"(\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3})"
        R"(\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF})"
        R"(\x{1E900}-\x{1E943}]+)",
        R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)",
        R"(\s+$)", R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)", R"(\p{N}+)"}},
      {{"deepseek-coder"},
       {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)",
        R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)", R"(\p{N})"}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2Split, R"([0-9][0-9][0-9])"}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
       {R"(\p{N})"},
       true},
      // A file without tokenizer.ggml.pre (written before llama.cpp recorded it) or with
      // "default": llama.cpp's default split, as llama.cpp tokenizes such a file.
      {{"", "default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2Split, R"(\p{N}+)", R"([0-9][0-9][0-9])"}},
  };
  return kSplits;
}

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

// The pre-tokenizer of llama.cpp's tokenizer.ggml.pre `name` (pre_splits()), as tokenizer.json
// writes it; te::Error naming `name` and the known names when it is none of them.
const PreSplit& pre_split(const std::string& name, const std::string& path) {
  std::string known;
  for (const PreSplit& p : pre_splits()) {
    for (const char* n : p.names) {
      if (name == n) return p;
      if (*n != '\0') known += (known.empty() ? "" : ", ") + std::string(n);
    }
  }
  TE_FAIL("tokenizer: '", path, "': tokenizer.ggml.pre: '", name,
          "' is not a pre-tokenizer te-cpp knows; te-cpp splits text as llama.cpp does for ", known,
          " (and a file without the key)");
}

json pre_tokenizer(const PreSplit& p) {
  json byte_level = byte_level_part();
  byte_level["use_regex"] = p.gpt2_regex;
  if (p.splits.empty()) return byte_level;
  json parts = json::array();
  for (const char* regex : p.splits) {
    parts.push_back({{"type", "Split"},
                     {"pattern", {{"Regex", regex}}},
                     {"behavior", "Isolated"},
                     {"invert", false}});
  }
  parts.push_back(byte_level);
  return {{"type", "Sequence"}, {"pretokenizers", parts}};
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
  // Each token as BPE produces it, in the byte alphabet: a token written in plain text is
  // respelled, unless it is user-defined (type 4: an added token, matched on the raw text as
  // written) or its respelling is another token's own spelling (then BPE produces that one, and
  // this one stays as written, reachable as tokenizer.json's duplicates are: never).
  const std::size_t n = tokens->strings.size();
  std::vector<bool> in_bytes(n);
  std::set<std::string> own;
  for (std::size_t i = 0; i < n; ++i) {
    const std::string& t = tokens->strings[i];
    detail::utf8_to_code_points(t, "tokenizer: GGUF token");
    in_bytes[i] = detail::to_byte_level(detail::from_byte_level(t)) == t;
    if (in_bytes[i]) own.insert(t);
  }
  json vocab = json::object();
  for (std::size_t i = 0; i < n; ++i) {
    const std::string& t = tokens->strings[i];
    const bool user_defined = types != nullptr && types->integers[i] == 4;
    std::string spelled = t;
    if (!in_bytes[i] && !user_defined && own.count(detail::to_byte_level(t)) == 0) {
      spelled = detail::to_byte_level(t);
    }
    if (vocab.contains(spelled)) {
      fail("tokenizer.ggml.tokens",
           "token " + std::to_string(i) + " '" + t + "' is token " +
               std::to_string(vocab[spelled].get<std::size_t>()) +
               " again (spelled in the byte alphabet); each token must be spelled once");
    }
    vocab[spelled] = i;
  }
  const json added = added_tokens(*tokens, types);
  const json byte_level = byte_level_part();
  const PreSplit& split = pre_split(file.string("tokenizer.ggml.pre").value_or(""), path);
  const json doc = {{"version", "1.0"},
                    {"added_tokens", added},
                    {"normalizer", nullptr},
                    {"pre_tokenizer", pre_tokenizer(split)},
                    {"post_processor",
                     {{"type", "TemplateProcessing"},
                      {"single", {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                      {"pair", json::array()},
                      {"special_tokens", json::object()}}},
                    {"decoder", byte_level},
                    {"model",
                     {{"type", "BPE"},
                      {"vocab", vocab},
                      {"merges", merges->strings},
                      {"ignore_merges", split.ignore_merges}}}};
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
