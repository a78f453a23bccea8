// te::hf::Tokenizer from a GGUF file's tokenizer metadata (tokenizer.ggml.*), as the model's own
// tokenizer splits and merges (llama.cpp's src/llama-vocab.cpp; transformers 5.23.0
// integrations/gguf/gguf_tokenizer_mapping.py for what it shares): written as a tokenizer.json
// document and read by Tokenizer::from_json, so the pipeline has one home.

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <unordered_map>

#include "bpe.h"
#include "te/error.h"
#include "te/hf/gguf.h"
#include "te/hf/tokenizer.h"
#include "unicode.h"

namespace te::hf {

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
      // GPT-4o's (o200k) split: gpt-oss's and Llama 4's files (LLAMA_VOCAB_PRE_TYPE_GPT4O).
      {{"gpt-4o", "llama4", "kanana2", "talkie"},
       {R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+)"
        R"([\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3})"
        R"(| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
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

// SentencePiece's space, U+2581, as llama.cpp's converters write it in GGUF vocabularies.
const std::string kSpace = "\xE2\x96\x81";

using Fail = std::function<void(const std::string& key, const std::string& message)>;

// vocab[spelled] = i, for token i written `token` in the file; te::Error when another token
// already has that spelling (`how` says which spelling), each token must be spelled once.
void add_token(json& vocab, const std::string& spelled, std::size_t i, const std::string& token,
               const std::string& how, const Fail& fail) {
  if (vocab.contains(spelled)) {
    fail("tokenizer.ggml.tokens", "token " + std::to_string(i) + " '" + token + "' is token " +
                                      std::to_string(vocab[spelled].get<std::size_t>()) + " again" +
                                      how + "; each token must be spelled once");
  }
  vocab[spelled] = i;
}

// The added tokens of a GGUF vocabulary: control tokens (type 3) are special added tokens (in a
// byte-level vocabulary only those spelled in the byte alphabet), user-defined ones (type 4)
// plain added tokens.
json added_tokens(const GgufValue& tokens, const GgufValue* types, bool byte_level) {
  json added = json::array();
  if (types == nullptr) return added;
  for (std::size_t i = 0; i < types->integers.size() && i < tokens.strings.size(); ++i) {
    const int64_t type = types->integers[i];
    const bool in_bytes =
        !byte_level ||
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

// The template that adds the special tokens: BOS when tokenizer.ggml.add_bos_token (absent:
// `bos_by_default`, true for SentencePiece as llama.cpp and transformers' GGUF loader have it;
// whatever it says with `bos_always`), EOS when add_eos_token.
json post_processor(const GgufHeader& file, const GgufValue& tokens, bool bos_by_default,
                    const Fail& fail, bool bos_always = false) {
  json single = json::array(), special = json::object();
  auto add = [&](const char* flag, const char* id_key, bool by_default, bool always) {
    if (!always && file.integer(std::string("tokenizer.ggml.") + flag).value_or(by_default) == 0) {
      return;
    }
    const std::string key = std::string("tokenizer.ggml.") + id_key;
    const std::optional<int64_t> id = file.integer(key);
    if (!id || *id < 0 || *id >= static_cast<int64_t>(tokens.strings.size())) {
      fail(key, "is missing or not a token id, and tokenizer.ggml." + std::string(flag) +
                    " asks for the token");
    }
    const std::string& name = tokens.strings[static_cast<std::size_t>(*id)];
    single.push_back({{"SpecialToken", {{"id", name}, {"type_id", 0}}}});
    special[name] = {{"id", name}, {"ids", {*id}}, {"tokens", {name}}};
  };
  add("add_bos_token", "bos_token_id", bos_by_default, bos_always);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  add("add_eos_token", "eos_token_id", false, false);
  return {{"type", "TemplateProcessing"},
          {"single", single},
          {"pair", json::array()},
          {"special_tokens", special}};
}

// tokenizer.ggml.merges: a non-empty list of UTF-8 strings, or te::Error naming the key.
const GgufValue& file_merges(const GgufHeader& file, const Fail& fail) {
  const GgufValue* merges = file.value("tokenizer.ggml.merges");
  if (merges == nullptr || merges->type != 9 || merges->element_type != 8 ||
      merges->strings.empty()) {
    fail("tokenizer.ggml.merges", "is missing or not a non-empty list of strings");
  }
  for (const std::string& m : merges->strings) {
    detail::utf8_to_code_points(m, "tokenizer: GGUF merge");
  }
  return *merges;
}

// The vocabulary as the file spells it ({token: id}, each token UTF-8 and spelled once); `ids`
// gets the same map when given.
json written_vocab(const GgufValue& tokens, const Fail& fail,
                   std::unordered_map<std::string, int64_t>* ids = nullptr) {
  json vocab = json::object();
  for (std::size_t i = 0; i < tokens.strings.size(); ++i) {
    const std::string& t = tokens.strings[i];
    detail::utf8_to_code_points(t, "tokenizer: GGUF token");
    add_token(vocab, t, i, t, "", fail);
    if (ids != nullptr) ids->emplace(t, static_cast<int64_t>(i));
  }
  return vocab;
}

// tokenizer.json's ByteLevel pipeline for a GGUF "gpt2" vocabulary: byte-level BPE with its
// merges and the split tokenizer.ggml.pre names.
json byte_level_document(const GgufHeader& file, const GgufValue* tokens, const GgufValue* types,
                         const Fail& fail) {
  const GgufValue& merges = file_merges(file, fail);
  const std::string path = file.path;
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
    add_token(vocab, spelled, i, t, " (spelled in the byte alphabet)", fail);
  }
  const json added = added_tokens(*tokens, types, /*byte_level=*/true);
  const json byte_level = byte_level_part();
  const PreSplit& split = pre_split(file.string("tokenizer.ggml.pre").value_or(""), path);
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer(split)},
          {"post_processor", post_processor(file, *tokens, /*bos_by_default=*/false, fail)},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"},
            {"vocab", vocab},
            {"merges", merges.strings},
            {"ignore_merges", split.ignore_merges}}}};
}

// The merges a SentencePiece vocabulary implies (transformers 5.23.0
// tokenization_utils_base.py generate_merges, as its GGUF loader derives them): every split of a
// token into two tokens, best score first (then the longer left, the longer right), in token
// order and, within a token, by the halves' ids.
json merges_from_scores(const std::vector<std::string>& tokens, const std::vector<double>& scores,
                        const std::unordered_map<std::string, int64_t>& ids) {
  struct Merge {
    std::size_t token;
    int64_t left, right;
    std::size_t left_chars, right_chars;
  };
  std::vector<Merge> merges;
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    const std::u32string cps = detail::utf8_to_code_points(tokens[t], "tokenizer: GGUF token");
    std::vector<Merge> local;
    std::size_t byte = 0;
    for (std::size_t i = 1; i < cps.size(); ++i) {
      byte += detail::to_utf8(cps.substr(i - 1, 1)).size();
      const auto l = ids.find(tokens[t].substr(0, byte)), r = ids.find(tokens[t].substr(byte));
      if (l != ids.end() && r != ids.end()) {
        local.push_back({t, l->second, r->second, i, cps.size() - i});
      }
    }
    std::sort(local.begin(), local.end(), [](const Merge& x, const Merge& y) {
      return std::tie(x.left, x.right) < std::tie(y.left, y.right);
    });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(), [&](const Merge& x, const Merge& y) {
    return std::make_tuple(scores[x.token], x.left_chars, x.right_chars) >
           std::make_tuple(scores[y.token], y.left_chars, y.right_chars);
  });
  json out = json::array();
  for (const Merge& m : merges) {
    out.push_back(
        {tokens[static_cast<std::size_t>(m.left)], tokens[static_cast<std::size_t>(m.right)]});
  }
  return out;
}

// tokenizer.json's SentencePiece-style BPE over text with spaces as U+2581 (no pre-tokenizer:
// each text is one word), unknown characters as their bytes' tokens <0xXX>, else the unknown
// token; decoded back. `space_prefix`: a U+2581 put before the text (and taken off on decoding);
// `bos_always`: BOS added whatever tokenizer.ggml.add_bos_token says.
json spaced_bpe_document(const GgufHeader& file, const GgufValue* tokens, const GgufValue* types,
                         json vocab, json merges, bool space_prefix, const Fail& fail,
                         bool bos_always = false) {
  const int64_t unk = file.integer("tokenizer.ggml.unknown_token_id").value_or(0);
  if (unk < 0 || unk >= static_cast<int64_t>(tokens->strings.size())) {
    fail("tokenizer.ggml.unknown_token_id", std::to_string(unk) + " is not a token id");
  }
  json normalizers = json::array();
  if (space_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", kSpace}});
  normalizers.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}});
  json decoders = {{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                   {{"type", "ByteFallback"}},
                   {{"type", "Fuse"}}};
  if (space_prefix) {
    decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  }
  return {
      {"version", "1.0"},
      {"added_tokens", added_tokens(*tokens, types, /*byte_level=*/false)},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", normalizers}}},
      {"pre_tokenizer", nullptr},
      {"post_processor", post_processor(file, *tokens, /*bos_by_default=*/true, fail, bos_always)},
      {"decoder", {{"type", "Sequence"}, {"decoders", decoders}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", std::move(vocab)},
        {"merges", std::move(merges)},
        {"unk_token", tokens->strings[static_cast<std::size_t>(unk)]},
        {"fuse_unk", true},
        {"byte_fallback", true}}}};
}

// tokenizer.json's SentencePiece pipeline for a GGUF "llama" vocabulary (Llama 2's tokenizer.json:
// a space prefixed when tokenizer.ggml.add_space_prefix, spaces as U+2581, BPE with merges from
// the scores, unknown characters as their bytes' tokens, else <unk>; decoded back), as llama.cpp
// tokenizes it (src/llama-vocab.cpp, llm_tokenizer_spm_session).
json sentencepiece_document(const GgufHeader& file, const GgufValue* tokens, const GgufValue* types,
                            const Fail& fail) {
  const GgufValue* scores = file.value("tokenizer.ggml.scores");
  if (scores == nullptr || scores->type != 9 || scores->numbers.size() != tokens->strings.size()) {
    fail("tokenizer.ggml.scores", "is missing or not a list of one number per token");
  }
  for (std::size_t i = 0; i < scores->numbers.size(); ++i) {  // they order the merges
    if (!std::isfinite(scores->numbers[i])) {
      fail("tokenizer.ggml.scores", "entry " + std::to_string(i) + " is not a finite number");
    }
  }
  std::unordered_map<std::string, int64_t> ids;
  json vocab = written_vocab(*tokens, fail, &ids);
  const bool space_prefix = file.integer("tokenizer.ggml.add_space_prefix").value_or(1) != 0;
  return spaced_bpe_document(file, tokens, types, std::move(vocab),
                             merges_from_scores(tokens->strings, scores->numbers, ids),
                             space_prefix, fail);
}

// tokenizer.json's pipeline for a GGUF "gemma4" vocabulary: Gemma 4's BPE over raw UTF-8 with
// spaces as U+2581, no space prefix, the file's merges, byte fallback to <0xXX> (transformers
// 5.23.0 models/gemma/tokenization_gemma.py GemmaTokenizer, as its GGUF loader builds it for
// "gemma4": gguf_tokenizer_mapping.py; llama.cpp's src/llama-vocab.cpp LLAMA_VOCAB_PRE_TYPE_GEMMA4
// tokenizes the same ids). BOS always, whatever tokenizer.ggml.add_bos_token says, as llama.cpp
// adds it (llama_vocab::impl::load, "workaround for Gemma 4"); transformers' GGUF loader never
// adds it, since Gemma 4's chat template writes <bos> itself (te's chat prompts are encoded
// without special tokens, so they get that one only).
json gemma4_document(const GgufHeader& file, const GgufValue* tokens, const GgufValue* types,
                     const Fail& fail) {
  const GgufValue& merges = file_merges(file, fail);
  json vocab = written_vocab(*tokens, fail);
  return spaced_bpe_document(file, tokens, types, std::move(vocab), merges.strings,
                             /*space_prefix=*/false, fail, /*bos_always=*/true);
}

// tokenizer.json's BERT pipeline for a GGUF "bert" vocabulary, as llama.cpp tokenizes it
// (src/llama-vocab.cpp, llm_tokenizer_wpm_session): llama.cpp's converter writes a word's first
// piece with U+2581 before it and a continuing piece bare, where WordPiece has the piece bare and
// "##" before it; BertNormalizer with tokenizer.ggml.normalizer.lowercase (default true) and
// strip_accents (default: as lowercase), the BERT pre-tokenizer, [CLS] A [SEP].
json wordpiece_document(const GgufHeader& file, const GgufValue* tokens, const GgufValue* types,
                        const Fail& fail) {
  json vocab = json::object();
  for (std::size_t i = 0; i < tokens->strings.size(); ++i) {
    const std::string& t = tokens->strings[i];
    detail::utf8_to_code_points(t, "tokenizer: GGUF token");
    const bool control = types != nullptr && types->integers[i] == 3;
    const std::string piece = control                   ? t
                              : t.rfind(kSpace, 0) == 0 ? t.substr(kSpace.size())
                                                        : "##" + t;
    add_token(vocab, piece, i, t, " (as WordPiece spells it)", fail);
  }
  auto token_id = [&](const char* key, int64_t fallback) {
    const int64_t id = file.integer(std::string("tokenizer.ggml.") + key).value_or(fallback);
    if (id < 0 || id >= static_cast<int64_t>(tokens->strings.size())) {
      fail(std::string("tokenizer.ggml.") + key, std::to_string(id) + " is not a token id");
    }
    return id;
  };
  // llama.cpp's defaults for a BERT vocabulary (BERT's own ids).
  const int64_t unk = token_id("unknown_token_id", 100), cls = token_id("cls_token_id", 101),
                sep = token_id("seperator_token_id", 102);
  const auto name = [&](int64_t id) { return tokens->strings[static_cast<std::size_t>(id)]; };
  const bool lowercase = file.integer("tokenizer.ggml.normalizer.lowercase").value_or(1) != 0;
  const bool strip_accents =
      file.integer("tokenizer.ggml.normalizer.strip_accents").value_or(lowercase) != 0;
  return {{"version", "1.0"},
          {"added_tokens", added_tokens(*tokens, types, /*byte_level=*/false)},
          {"normalizer",
           {{"type", "BertNormalizer"},
            {"clean_text", true},
            {"handle_chinese_chars", true},
            {"strip_accents", strip_accents},
            {"lowercase", lowercase}}},
          {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
          {"post_processor",
           {{"type", "BertProcessing"}, {"sep", {name(sep), sep}}, {"cls", {name(cls), cls}}}},
          {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
          {"model",
           {{"type", "WordPiece"},
            {"unk_token", name(unk)},
            {"continuing_subword_prefix", "##"},
            {"max_input_chars_per_word", 100},
            {"vocab", vocab}}}};
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const std::string& path) {
  return from_gguf(read_gguf_header(path));
}

Tokenizer Tokenizer::from_gguf(const GgufHeader& file) {
  const std::string& path = file.path;
  const Fail fail = [&](const std::string& key, const std::string& message) {
    TE_FAIL("tokenizer: '", path, "': ", key, ": ", message);
  };
  const std::string model = file.string("tokenizer.ggml.model").value_or("");
  if (model != "gpt2" && model != "llama" && model != "gemma4" && model != "bert") {
    fail("tokenizer.ggml.model", "'" + model +
                                     "' is not a tokenizer te-cpp builds from GGUF metadata "
                                     "(gpt2: byte-level BPE; llama: SentencePiece BPE; gemma4: "
                                     "Gemma 4's BPE; bert: WordPiece)");
  }
  const GgufValue* tokens = file.value("tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->type != 9 || tokens->element_type != 8 ||
      tokens->strings.empty()) {
    fail("tokenizer.ggml.tokens", "is missing or not a non-empty list of strings");
  }
  const GgufValue* types = file.value("tokenizer.ggml.token_type");
  if (types != nullptr && (types->type != 9 || types->strings.size() > 0 ||
                           types->integers.size() != tokens->strings.size())) {
    fail("tokenizer.ggml.token_type", "is not a list of one integer per token");
  }
  const json doc = model == "gpt2"     ? byte_level_document(file, tokens, types, fail)
                   : model == "llama"  ? sentencepiece_document(file, tokens, types, fail)
                   : model == "gemma4" ? gemma4_document(file, tokens, types, fail)
                                       : wordpiece_document(file, tokens, types, fail);
  return from_json(doc.dump(), path + " (GGUF tokenizer metadata)");
}

}  // namespace te::hf
