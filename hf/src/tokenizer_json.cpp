// te::hf::Tokenizer read from tokenizer.json (strictly: an unknown part or field is refused by
// name) or from BERT's vocab.txt with its tokenizer_config.json.

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "json_fields.h"
#include "te/error.h"
#include "tokenizer_impl.h"
#include "unicode.h"

namespace te::hf {

namespace fs = std::filesystem;
using detail::Fields;
using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Reading tokenizer.json and vocab.txt

namespace {

using Impl = Tokenizer::Impl;

void set_vocab(Impl& t, std::vector<std::string> tokens, const std::string& where) {
  t.tokens = std::move(tokens);
  t.vocab.clear();
  for (std::size_t i = 0; i < t.tokens.size(); ++i) {
    TE_CHECK(t.vocab.emplace(t.tokens[i], static_cast<int64_t>(i)).second, "tokenizer: ", where,
             ": token '", t.tokens[i], "' appears twice in the vocabulary");
  }
  const auto unk = t.vocab.find(t.unk_token);
  TE_CHECK(unk != t.vocab.end(), "tokenizer: ", where, ": the unknown token '", t.unk_token,
           "' is not in the vocabulary");
  t.unk_id = unk->second;
  t.is_special.assign(t.tokens.size(), false);
}

// The model's vocab {token: id}: tokens by id, each id used once and below the size.
std::vector<std::string> read_vocab(Fields& f) {
  if (!f.has("vocab") || !f.raw("vocab").is_object()) f.fail("vocab", "expected an object");
  const json& v = f.raw("vocab");
  std::vector<std::string> tokens(v.size());
  std::vector<bool> used(v.size(), false);
  for (const auto& [token, id] : v.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= static_cast<int64_t>(v.size()) || used[id.get<std::size_t>()]) {
      f.fail("vocab", "entry '" + token + "': " + id.dump() +
                          " is not a unique id below the vocabulary's size");
    }
    used[id.get<std::size_t>()] = true;
    tokens[id.get<std::size_t>()] = token;
  }
  return tokens;
}

// BPE (models/bpe/serialization.rs): GPT-2's kind, or SentencePiece's (Llama 2's: an unknown
// token, unknown ones fused, byte fallback); no subword prefix or suffix and no dropout (te::Error
// naming any of those set).
void read_bpe(Impl& t, Fields& f, const std::string& path) {
  if (f.has("dropout")) f.fail("dropout", "is set; te-cpp implements BPE without it (null)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!f.string_or(key, "").empty()) f.fail(key, "is set; te-cpp implements BPE without it");
  }
  detail::BpeOptions options;
  options.byte_fallback = f.boolean_or("byte_fallback", false);
  options.fuse_unk = f.boolean_or("fuse_unk", false);
  const std::string unk = f.string_or("unk_token", "");
  options.ignore_merges = f.boolean_or("ignore_merges", false);
  std::vector<std::string> tokens = read_vocab(f);
  std::vector<std::pair<std::string, std::string>> merges;
  if (!f.has("merges") || !f.raw("merges").is_array()) f.fail("merges", "expected a list");
  for (const json& m : f.raw("merges")) {
    if (m.is_string()) {
      const std::string text = m.get<std::string>();
      const std::size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        f.fail("merges", "entry " + m.dump() + " is not two tokens separated by one space");
      }
      merges.emplace_back(text.substr(0, space), text.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      f.fail("merges", "entry " + m.dump() + " is not a pair of tokens");
    }
  }
  f.refuse_unread({});
  t.tokens = std::move(tokens);
  t.vocab.clear();
  for (std::size_t i = 0; i < t.tokens.size(); ++i) {
    t.vocab.emplace(t.tokens[i], static_cast<int64_t>(i));
  }
  t.is_special.assign(t.tokens.size(), false);
  if (!unk.empty()) {
    const auto it = t.vocab.find(unk);
    if (it == t.vocab.end()) f.fail("unk_token", "'" + unk + "' is not in the vocabulary");
    options.unk = it->second;
  }
  t.bpe = std::make_unique<detail::Bpe>(t.vocab, merges, options, "'" + path + "' model");
}

void read_model(Impl& t, const json& m, const std::string& path) {
  Fields f(m, path, "model.", "tokenizer");
  const std::string type = f.string_or("type", "");
  if (type == "BPE") return read_bpe(t, f, path);
  if (type != "WordPiece") {
    f.fail("type", "'" + type + "' is not a tokenizer model te-cpp implements (WordPiece, BPE)");
  }
  t.unk_token = f.string_or("unk_token", t.unk_token);
  t.prefix = f.string_or("continuing_subword_prefix", t.prefix);
  t.max_input_chars_per_word = f.integer_or("max_input_chars_per_word", 100);
  std::vector<std::string> tokens = read_vocab(f);
  f.refuse_unread({});
  set_vocab(t, std::move(tokens), "'" + path + "'");
}

void read_normalizer(Impl& t, const json& n, const std::string& path) {
  if (n.is_null()) return;
  Fields f(n, path, "normalizer.", "tokenizer");
  if (f.string_or("type", "") != "BertNormalizer") {
    return detail::read_text_edits(t.edits, n, path, "normalizer.");
  }
  BertNormalizer b;
  b.clean_text = f.boolean_or("clean_text", true);
  b.handle_chinese_chars = f.boolean_or("handle_chinese_chars", true);
  b.lowercase = f.boolean_or("lowercase", true);
  if (f.has("strip_accents")) b.strip_accents = f.boolean_or("strip_accents", false);
  f.refuse_unread({});
  t.normalizer = b;
}

void read_pre_tokenizer(Impl& t, const json& p, const std::string& path,
                        const std::string& what = "pre_tokenizer.") {
  if (p.is_null()) return;
  Fields f(p, path, what, "tokenizer");
  const std::string type = f.string_or("type", "");
  const std::string where = "'" + path + "' " + what.substr(0, what.size() - 1);
  if (type == "Sequence") {
    if (!f.has("pretokenizers") || !f.raw("pretokenizers").is_array()) {
      f.fail("pretokenizers", "expected a list");
    }
    const json& list = f.raw("pretokenizers");
    for (std::size_t i = 0; i < list.size(); ++i) {
      read_pre_tokenizer(t, list[i], path, what + "pretokenizers[" + std::to_string(i) + "].");
    }
  } else if (type == "BertPreTokenizer") {
    if (what != "pre_tokenizer.") f.fail("type", "BertPreTokenizer only alone");
    t.bert_pre_tokenizer = true;
  } else if (type == "ByteLevel") {
    // trim_offsets changes offsets only, which te does not report.
    f.has("trim_offsets");
    PreStep step;
    step.byte_level = true;
    step.add_prefix_space = f.boolean_or("add_prefix_space", true);
    if (f.boolean_or("use_regex", true)) {
      step.split = std::make_shared<detail::SplitRegex>(detail::gpt2_pattern(), where);
    }
    t.pre_steps.push_back(step);
  } else if (type == "Split") {
    if (!f.has("pattern") || !f.raw("pattern").is_object()) f.fail("pattern", "expected an object");
    const json& pattern = f.raw("pattern");
    std::string regex;
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      regex = pattern["Regex"].get<std::string>();
    } else if (pattern.contains("String") && pattern["String"].is_string()) {
      // The string literally: every ASCII punctuation character escaped.
      for (const char c : pattern["String"].get<std::string>()) {
        if (static_cast<unsigned char>(c) < 128 && std::ispunct(static_cast<unsigned char>(c))) {
          regex += '\\';
        }
        regex += c;
      }
    } else {
      f.fail("pattern", pattern.dump() + " is neither {\"Regex\": ...} nor {\"String\": ...}");
    }
    const std::string behavior = f.string_or("behavior", "");
    if (behavior != "Isolated") {
      f.fail("behavior", "'" + behavior + "': te-cpp implements Isolated");
    }
    if (f.boolean_or("invert", false)) f.fail("invert", "true is not implemented");
    PreStep step;
    step.split = std::make_shared<detail::SplitRegex>(regex, where);
    t.pre_steps.push_back(step);
  } else {
    f.fail("type", "'" + type +
                       "' is not a pre-tokenizer te-cpp implements (BertPreTokenizer, ByteLevel, "
                       "Split, Sequence)");
  }
  f.refuse_unread({});
}

int64_t id_of(const Impl& t, const std::string& token, const std::string& where) {
  const auto it = t.vocab.find(token);
  TE_CHECK(it != t.vocab.end(), "tokenizer: ", where, ": token '", token,
           "' is not in the vocabulary");
  return it->second;
}

void read_post_processor(Impl& t, const json& p, const std::string& path,
                         const std::string& what = "post_processor.") {
  if (p.is_null()) return;
  Fields f(p, path, what, "tokenizer");
  const std::string type = f.string_or("type", "");
  if (type == "ByteLevel") {
    // Offsets only (trim_offsets): the tokens are unchanged.
    for (const char* key : {"trim_offsets", "add_prefix_space", "use_regex"}) f.has(key);
    f.refuse_unread({});
    return;
  }
  if (type == "Sequence") {
    if (!f.has("processors") || !f.raw("processors").is_array()) {
      f.fail("processors", "expected a list");
    }
    const json& list = f.raw("processors");
    for (std::size_t i = 0; i < list.size(); ++i) {
      read_post_processor(t, list[i], path, what + "processors[" + std::to_string(i) + "].");
    }
    f.refuse_unread({});
    return;
  }
  if (type == "BertProcessing") {
    // ["[SEP]", 102] and ["[CLS]", 101]: [CLS] A [SEP].
    auto pair = [&](const char* key) {
      if (!f.has(key)) f.fail(key, "is missing");
      const json& v = f.raw(key);
      if (!v.is_array() || v.size() != 2 || !v[1].is_number_integer()) {
        f.fail(key, "expected [token, id], got " + v.dump());
      }
      return v[1].get<int64_t>();
    };
    t.single = {{false, {pair("cls")}, 0}, {true, {}, 0}, {false, {pair("sep")}, 0}};
    f.refuse_unread({});
    return;
  }
  if (type != "TemplateProcessing") {
    f.fail("type", "'" + type +
                       "' is not a post-processor te-cpp implements (TemplateProcessing, "
                       "BertProcessing, ByteLevel, Sequence)");
  }
  std::map<std::string, std::vector<int64_t>> special;
  if (f.has("special_tokens")) {
    for (const auto& [name, s] : f.raw("special_tokens").items()) {
      if (!s.is_object() || !s.contains("ids") || !s["ids"].is_array()) {
        f.fail("special_tokens", "entry '" + name + "' has no ids list");
      }
      special[name] = s["ids"].get<std::vector<int64_t>>();
    }
  }
  f.has("pair");  // pairs of texts: encode takes one text
  if (!f.has("single") || !f.raw("single").is_array()) f.fail("single", "expected a list");
  for (const json& piece : f.raw("single")) {
    if (piece.contains("Sequence")) {
      if (piece["Sequence"].value("id", "") != "A" ||
          std::any_of(t.single.begin(), t.single.end(),
                      [](const TemplatePiece& p) { return p.sequence; })) {
        f.fail("single", "te-cpp encodes one text: the template must hold Sequence A once");
      }
      t.single.push_back({true, {}, piece["Sequence"].value("type_id", int64_t{0})});
    } else if (piece.contains("SpecialToken")) {
      const std::string id = piece["SpecialToken"].value("id", "");
      const auto it = special.find(id);
      if (it == special.end()) f.fail("single", "names special token '" + id + "', not defined");
      t.single.push_back({false, it->second, piece["SpecialToken"].value("type_id", int64_t{0})});
    } else {
      f.fail("single", "entry " + piece.dump() + " is neither Sequence nor SpecialToken");
    }
  }
  f.refuse_unread({});
}

void read_decoder(Impl& t, const json& d, const std::string& path) {
  if (d.is_null()) return;
  Fields f(d, path, "decoder.", "tokenizer");
  const std::string type = f.string_or("type", "");
  if (type == "ByteLevel") {
    // decoders/byte_level.rs: the options concern offsets and encoding, not decoding.
    for (const char* key : {"trim_offsets", "add_prefix_space", "use_regex"}) f.has(key);
    t.decoder = Decoder::kByteLevel;
  } else if (type == "WordPiece") {
    t.decoder_prefix = f.string_or("prefix", "##");
    t.decoder_cleanup = f.boolean_or("cleanup", true);
    t.decoder = Decoder::kWordPiece;
  } else {
    detail::read_decode_steps(t.decode_steps, d, path, "decoder.");
    t.decoder = Decoder::kSteps;
    return;
  }
  f.refuse_unread({});
}

void read_added_tokens(Impl& t, const json& a, const std::string& path) {
  if (a.is_null()) return;
  if (!a.is_array()) TE_FAIL("tokenizer: '", path, "': added_tokens: expected a list");
  for (const json& token : a) {
    Fields f(token, path, "added_tokens[].", "tokenizer");
    AddedToken at;
    at.id = f.integer("id");
    at.content = f.string_or("content", "");
    at.special = f.boolean_or("special", false);
    for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
      if (f.boolean_or(flag, false)) {
        f.fail(flag, "true for '" + at.content + "': te-cpp matches added tokens exactly");
      }
    }
    if (f.boolean_or("normalized", false)) {
      f.fail("normalized",
             "true for '" + at.content + "': te-cpp matches added tokens on the raw text only");
    }
    f.refuse_unread({});
    if (at.content.empty()) f.fail("content", "is empty");
    if (at.id < 0 || at.id >= static_cast<int64_t>(t.tokens.size()) ||
        t.tokens[static_cast<std::size_t>(at.id)] != at.content) {
      f.fail("id", std::to_string(at.id) + " is not the vocabulary's id of '" + at.content + "'");
    }
    t.is_special[static_cast<std::size_t>(at.id)] = at.special;
    t.added.push_back(at);
  }
  std::stable_sort(t.added.begin(), t.added.end(), [](const AddedToken& x, const AddedToken& y) {
    return x.content.size() > y.content.size();
  });
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  TE_CHECK(in.good(), "tokenizer: cannot read '", path.string(), "'");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// BERT's vocab.txt (one token per line) with tokenizer_config.json's options beside it, as
// transformers' BertTokenizer builds its tokenizers pipeline.
std::shared_ptr<Impl> from_vocab_txt(const fs::path& path) {
  auto t = std::make_shared<Impl>();
  t->path = path.string();
  std::vector<std::string> tokens;
  std::string text = read_text(path), line;
  for (std::size_t at = 0; at < text.size();) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    line = text.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    tokens.push_back(line);
    at = end + 1;
  }
  BertNormalizer n;
  std::map<std::string, std::string> specials = {{"unk_token", "[UNK]"},
                                                 {"cls_token", "[CLS]"},
                                                 {"sep_token", "[SEP]"},
                                                 {"pad_token", "[PAD]"},
                                                 {"mask_token", "[MASK]"}};
  const fs::path config_path = path.parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (fs::exists(config_path, ec)) {
    const json c =
        detail::parse_json_object(read_text(config_path), config_path.string(), "tokenizer");
    n.lowercase = c.value("do_lower_case", true);
    if (c.contains("strip_accents") && !c["strip_accents"].is_null()) {
      n.strip_accents = c["strip_accents"].get<bool>();
    }
    n.handle_chinese_chars = c.value("tokenize_chinese_chars", true);
    TE_CHECK(c.value("do_basic_tokenize", true), "tokenizer: '", config_path.string(),
             "': do_basic_tokenize false is not implemented (te-cpp always splits on "
             "whitespace and punctuation)");
    for (auto& [key, value] : specials) {
      if (c.contains(key) && c[key].is_string()) value = c[key].get<std::string>();
    }
  }
  t->unk_token = specials["unk_token"];
  set_vocab(*t, std::move(tokens), "'" + path.string() + "'");
  t->normalizer = n;
  t->bert_pre_tokenizer = true;
  t->decoder = Decoder::kWordPiece;
  const std::string where = "'" + path.string() + "'";
  t->single = {{false, {id_of(*t, specials["cls_token"], where)}, 0},
               {true, {}, 0},
               {false, {id_of(*t, specials["sep_token"], where)}, 0}};
  for (const auto& [key, token] : specials) {
    const int64_t id = id_of(*t, token, where);
    t->is_special[static_cast<std::size_t>(id)] = true;
    t->added.push_back({token, id, true});
  }
  std::stable_sort(t->added.begin(), t->added.end(), [](const AddedToken& x, const AddedToken& y) {
    return x.content.size() > y.content.size();
  });
  t->pad_id = id_of(*t, specials["pad_token"], where);
  return t;
}

}  // namespace

namespace {

// What one tokenizer.json holds, read and checked (json exceptions left to from_json).
std::shared_ptr<Impl> read_tokenizer_json(std::string_view json_text, const std::string& path) {
  const json j = detail::parse_json_object(json_text, path, "tokenizer");
  Fields f(j, path, "", "tokenizer");
  auto t = std::make_shared<Impl>();
  t->path = path;
  if (!f.has("model")) f.fail("model", "is missing");
  read_model(*t, f.raw("model"), path);
  if (f.has("normalizer")) read_normalizer(*t, f.raw("normalizer"), path);
  if (f.has("pre_tokenizer")) read_pre_tokenizer(*t, f.raw("pre_tokenizer"), path);
  if (f.has("post_processor")) read_post_processor(*t, f.raw("post_processor"), path);
  if (f.has("decoder")) read_decoder(*t, f.raw("decoder"), path);
  if (f.has("added_tokens")) read_added_tokens(*t, f.raw("added_tokens"), path);
  // The parts te-cpp runs with one model only: BERT's with WordPiece, the byte-level ones with
  // BPE. Another combination would be run without a part: refused.
  if (t->bpe && (t->normalizer || t->bert_pre_tokenizer)) {
    f.fail(t->normalizer ? "normalizer" : "pre_tokenizer",
           "te-cpp runs BertNormalizer and BertPreTokenizer with a WordPiece model, not BPE");
  }
  if (!t->bpe && !t->pre_steps.empty()) {
    f.fail("pre_tokenizer", "te-cpp runs ByteLevel and Split with a BPE model, not WordPiece");
  }
  // The library's own call defaults (transformers replaces them per call, as encode's options
  // do here) and the format's version.
  f.has("truncation");
  if (f.has("padding") && f.raw("padding").contains("pad_id")) {
    const json& pad = f.raw("padding")["pad_id"];
    if (!pad.is_number_integer()) f.fail("padding.pad_id", "expected an integer");
    t->pad_id = pad.get<int64_t>();
  } else if (const auto pad = t->vocab.find("[PAD]"); pad != t->vocab.end()) {
    t->pad_id = pad->second;
  }
  const auto rows = static_cast<int64_t>(t->tokens.size());
  if (t->pad_id < 0 || t->pad_id >= rows) {
    f.fail("padding.pad_id", std::to_string(t->pad_id) + " is not an id of the vocabulary");
  }
  for (const TemplatePiece& piece : t->single) {
    for (const int64_t id : piece.ids) {
      if (id < 0 || id >= rows) {
        f.fail("post_processor", "special token id " + std::to_string(id) +
                                     " is not an id of the " + std::to_string(rows) +
                                     "-token vocabulary");
      }
    }
    if (piece.type_id < 0) f.fail("post_processor", "a type_id is negative");
  }
  f.has("version");
  f.refuse_unread({});
  return t;
}

}  // namespace

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& path) {
  try {
    return Tokenizer(read_tokenizer_json(json_text, path));
  } catch (const nlohmann::json::exception& e) {
    // A field of the wrong JSON type where te read it directly.
    TE_FAIL("tokenizer: '", path, "': a field has the wrong type: ", e.what());
  }
}

Tokenizer Tokenizer::from_vocab_txt(const std::string& path) {
  try {
    return Tokenizer(te::hf::from_vocab_txt(path));
  } catch (const nlohmann::json::exception& e) {
    TE_FAIL("tokenizer: '", path,
            "' or its tokenizer_config.json: a field has the wrong type: ", e.what());
  }
}

Tokenizer Tokenizer::from_json_file(const std::string& path) {
  return from_json(read_text(path), path);
}

}  // namespace te::hf
