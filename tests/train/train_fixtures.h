#pragma once

// What te::train's tests share: a small real byte-level BPE tokenizer with ChatML's special
// tokens (fuzz/corpus/tokenizer/tokenizer-bpe.json, SmolLM2's kind cut to 400 tokens), a ChatML
// template, and files written into a temporary directory.

#include <fstream>
#include <string>

#include "te/gen/chat_template.h"
#include "te/hf/tokenizer.h"

namespace te::test {

inline std::string bpe_tokenizer_path() {
  return std::string(TE_SOURCE_DIR) + "/fuzz/corpus/tokenizer/tokenizer-bpe.json";
}

inline const te::hf::Tokenizer& bpe_tokenizer() {
  static const te::hf::Tokenizer tok = te::hf::Tokenizer::from_file(bpe_tokenizer_path());
  return tok;
}

// SmolLM2-Instruct's template (its default system message shortened).
inline te::gen::ChatTemplate chatml_template() {
  return te::gen::ChatTemplate::recognise(
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\nBe kind.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + "
      "message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
      "test");
}

inline void write_file(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
}

}  // namespace te::test
