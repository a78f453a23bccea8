// The chat mask on real tokenizers (CTest runs it after the interop fixture te_models,
// scripts/fetch_models.py, fills the model cache; run alone on an empty cache it skips):
// SmolLM2-135M-Instruct's GGUF with its own ChatML template and llama.cpp's Llama 3 vocabulary with
// Llama 3's template. tokenize_chat itself holds the pieces' tokens to the whole rendering's; here
// the masked runs must decode to each assistant message's content and its end-of-turn token.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "te/hf/chat.h"
#include "te/train/tokens.h"

namespace {

std::string cached(const std::string& name) {
  const char* env = std::getenv("TE_MODEL_CACHE");
  const char* home = std::getenv("HOME");
  const std::string dir =
      env != nullptr ? env : std::string(home ? home : "") + "/.cache/te-cpp/models";
  return dir + "/" + name;
}

const std::vector<std::vector<te::gen::ChatMessage>>& conversations() {
  static const std::vector<std::vector<te::gen::ChatMessage>> c = {
      {{"user", "Hi there"}, {"assistant", "Hello! How can I help?"}},
      {{"system", "Answer briefly."},
       {"user", "What is 12 + 30?"},
       {"assistant", " 42\n\n"},
       {"user", "  And in French? "},
       {"assistant", "Quarante-deux, «42» 🙂"}},
      {{"user", "Write code"}, {"assistant", "```cpp\nint main() {}\n```"}, {"user", "Thanks"}},
  };
  return c;
}

std::vector<std::string> masked_runs(const te::hf::Tokenizer& tok,
                                     const te::train::TokenizedDocument& doc) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < doc.ids.size();) {
    size_t j = i;
    while (j < doc.ids.size() && doc.mask[j] == doc.mask[i]) ++j;
    if (doc.mask[i]) runs.push_back(tok.decode({doc.ids.begin() + i, doc.ids.begin() + j}, false));
    i = j;
  }
  return runs;
}

void check(const te::hf::Tokenizer& tok, const te::gen::ChatTemplate& t, bool trim,
           const std::string& end_of_turn) {
  for (const auto& chat : conversations()) {
    const auto doc = te::train::tokenize_chat(tok, t, chat, "chat");
    std::vector<std::string> want;
    for (const auto& m : chat) {
      if (m.role != "assistant") continue;
      std::string c = m.content;
      if (trim)
        c = c.substr(c.find_first_not_of(" \n"),
                     c.find_last_not_of(" \n") + 1 - c.find_first_not_of(" \n"));
      // SmolLM2 splits "\n " as one token: the generation prompt's newline with the content's
      // space. It overlaps the content, so it counts (transformers' rule: any overlap).
      if (!trim && c[0] == ' ') c = "\n" + c;
      want.push_back(c + end_of_turn);
    }
    EXPECT_EQ(masked_runs(tok, doc), want);
  }
}

TEST(RealTokenizers, SmolLM2ChatMaskIsTheAssistantContentAndImEnd) {
  const std::string gguf = cached("SmolLM2-135M-Instruct.Q4_1.gguf");
  if (!std::filesystem::exists(gguf)) GTEST_SKIP() << gguf << " is not in the model cache";
  const auto tok = te::hf::Tokenizer::from_gguf(gguf);
  const auto t =
      te::gen::ChatTemplate::recognise(te::hf::read_generation_defaults(gguf).chat_template, gguf);
  check(tok, t, false, "<|im_end|>");
}

TEST(RealTokenizers, Llama3ChatMaskIsTheTrimmedContentAndEotId) {
  const std::string gguf = cached("llama.cpp-vocab/ggml-vocab-llama-bpe.gguf");
  if (!std::filesystem::exists(gguf)) GTEST_SKIP() << gguf << " is not in the model cache";
  const auto tok = te::hf::Tokenizer::from_gguf(gguf);
  // Meta-Llama-3-8B-Instruct's tokenizer_config.json (tests/interop/check_generate.py's LLAMA3).
  const auto t = te::gen::ChatTemplate::recognise(
      "{% set loop_messages = messages %}{% for message in loop_messages %}"
      "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
      "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
      "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
      "{% endif %}",
      "llama3");
  check(tok, t, true, "<|eot_id|>");
}

}  // namespace
