// Tokenizes texts with te::hf::Tokenizer for tests/interop/check_tokenizers.py to hold to Hugging
// Face tokenizers: per text the ids and type ids (with the model's special tokens), the decoded
// text of those ids, and with --max-length N the ids truncated to N and whether they were;
// --no-special leaves the special tokens out (llama.cpp's vocab test vectors have none).
//
//   te_interop_tokenize --tokenizer tokenizer.json|vocab.txt|FILE.gguf --texts TEXTS.json
//                       --out OUT.json [--max-length N] [--no-special]

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "te/hf/tokenizer.h"

int main(int argc, char** argv) {
  std::string tokenizer_path, texts_path, out_path;
  int64_t max_length = 0;
  bool usage = false, special = true;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const bool has_value = i + 1 < argc;
    if (flag == "--tokenizer" && has_value) {
      tokenizer_path = argv[++i];
    } else if (flag == "--texts" && has_value) {
      texts_path = argv[++i];
    } else if (flag == "--out" && has_value) {
      out_path = argv[++i];
    } else if (flag == "--no-special") {
      special = false;
    } else if (flag == "--max-length" && has_value) {
      char* end = nullptr;
      max_length = std::strtoll(argv[++i], &end, 10);
      usage = *end != '\0' || max_length < 1;
    } else {
      usage = true;
    }
  }
  if (usage || tokenizer_path.empty() || texts_path.empty() || out_path.empty()) {
    std::fprintf(stderr,
                 "usage: te_interop_tokenize --tokenizer tokenizer.json|vocab.txt|FILE.gguf "
                 "--texts TEXTS.json --out OUT.json [--max-length N] [--no-special]\n");
    return 2;
  }
  try {
    const te::hf::Tokenizer tok = te::hf::Tokenizer::from_file(tokenizer_path);
    const auto texts = nlohmann::json::parse(std::ifstream(texts_path));
    nlohmann::json out = {{"ids", nlohmann::json::array()},
                          {"type_ids", nlohmann::json::array()},
                          {"decoded", nlohmann::json::array()}};
    for (const auto& text : texts) {
      const te::hf::Encoding e = tok.encode(text.get<std::string>(), {special});
      out["ids"].push_back(e.ids);
      out["type_ids"].push_back(e.type_ids);
      out["decoded"].push_back(tok.decode(e.ids));
      if (max_length > 0) {
        const te::hf::Encoding cut = tok.encode(text.get<std::string>(), {special, max_length});
        out["truncated_ids"].push_back(cut.ids);
        out["truncated"].push_back(cut.truncated);
      }
    }
    std::ofstream(out_path) << out.dump();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "te_interop_tokenize: %s\n", e.what());
    return 1;
  }
  return 0;
}
