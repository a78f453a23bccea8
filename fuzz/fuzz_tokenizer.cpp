// libFuzzer target: te::hf's tokenizer readers and encoders (hf/src/tokenizer.cpp, bpe.cpp;
// ICU, PCRE2; no LibTorch). An input starting with '{' is a tokenizer.json: it parses or throws te::Error, and
// what parses encodes and decodes a few fixed texts. Any other input is text for a fixed BERT
// tokenizer: it encodes (or throws te::Error for invalid UTF-8) to ids inside the vocabulary,
// which decode. Anything else (another exception, a crash, a sanitizer report) is a bug.
//   bash scripts/fuzz.sh [seconds per target]
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "te/error.h"
#include "te/hf/tokenizer.h"

namespace {

const char kBert[] = R"({"version": "1.0", "added_tokens": [
 {"id": 0, "content": "[PAD]", "single_word": false, "lstrip": false, "rstrip": false,
  "normalized": false, "special": true},
 {"id": 1, "content": "[UNK]", "single_word": false, "lstrip": false, "rstrip": false,
  "normalized": false, "special": true},
 {"id": 2, "content": "[CLS]", "single_word": false, "lstrip": false, "rstrip": false,
  "normalized": false, "special": true},
 {"id": 3, "content": "[SEP]", "single_word": false, "lstrip": false, "rstrip": false,
  "normalized": false, "special": true}],
 "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                "strip_accents": null, "lowercase": true},
 "pre_tokenizer": {"type": "BertPreTokenizer"},
 "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
 "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
 "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
           "max_input_chars_per_word": 100,
           "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "a": 4, "##b": 5,
                     "c": 6, ",": 7, "\u00e9": 8, "##\u00e9": 9}}})";

void check(const te::hf::Tokenizer& tok, std::string_view text) {
  try {
    for (const int64_t max_length : {0, 3}) {
      const te::hf::Encoding e = tok.encode(text, {true, max_length});
      if (e.ids.size() != e.type_ids.size()) __builtin_trap();
      if (max_length > 0 && static_cast<int64_t>(e.ids.size()) > max_length) __builtin_trap();
      for (int64_t id : e.ids) {
        if (id < 0 || id >= tok.vocab_size()) __builtin_trap();
      }
      tok.decode(e.ids);
      tok.decode(e.ids, false);
    }
  } catch (const te::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  if (!input.empty() && input[0] == '{') {
    try {
      const te::hf::Tokenizer tok = te::hf::Tokenizer::from_json(input, "fuzz/tokenizer.json");
      for (const char* text : {"", "Hello, world!", "caf\xc3\xa9 \xe6\x88\x91 [CLS] x"}) {
        check(tok, text);
      }
    } catch (const te::Error&) {
    }
    return 0;
  }
  static const te::hf::Tokenizer bert = te::hf::Tokenizer::from_json(kBert, "bert.json");
  check(bert, input);
  return 0;
}
