// te::hf::Tokenizer from files: the kind a path names (tokenizer.json, vocab.txt, a GGUF file:
// tokenizer_gguf.cpp), or a Hugging Face folder's.

#include <filesystem>

#include "te/error.h"
#include "te/hf/tokenizer.h"

namespace te::hf {

namespace fs = std::filesystem;

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
