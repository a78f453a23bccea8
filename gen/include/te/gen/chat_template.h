#pragma once

// The chat templates te-cpp applies: a model's chat_template (Jinja text, as its files hold it;
// te::hf::read_generation_defaults reads it) recognised as one of the families te-cpp knows, and
// the prompt it writes for a conversation. There is no Jinja library in Debian's C++ packages,
// so te-cpp recognises the template families of the models it serves and refuses any other by
// name:
//   - ChatML (SmolLM2, Qwen2/3, ...): <|im_start|>{role}\n{content}<|im_end|>\n per message,
//     a default system message when the template adds one before a first non-system message,
//     and <|im_start|>assistant\n as the generation prompt;
//   - Llama 3: <|begin_of_text|>, then <|start_header_id|>{role}<|end_header_id|>\n\n{content}
//     <|eot_id|> per message (content stripped), <|start_header_id|>assistant<|end_header_id|>\n\n;
//   - Phi-3 / Phi-3.5: <|{role}|>\n{content}<|end|>\n per message (Phi-3.5's leaves out a
//     system message with empty content), <|assistant|>\n as the generation prompt (without it
//     the template ends with the tokenizer's eos_token: refused).
//   - Gemma (1, 2, 3): <bos>, then <start_of_turn>{user | model}\n{content}<end_of_turn>\n per
//     message (content stripped; user first, alternating), <start_of_turn>model\n; a system
//     message refused (Gemma 1, 2) or the first turn's prefix, content + "\n\n" (Gemma 3).
// tests/interop/check_generate.py holds them to transformers' apply_chat_template. No LibTorch.

#include <string>
#include <vector>

namespace te::gen {

struct ChatMessage {
  std::string role;  ///< "system", "user" or "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  /// Recognises `jinja` (a model's chat_template); te::Error naming `where` and the families
  /// te-cpp knows when it is none of them.
  static ChatTemplate recognise(const std::string& jinja, const std::string& where);
  /// The prompt for `messages` (te::Error for an unknown role or no message), ending with the
  /// assistant's generation prompt when asked.
  std::string apply(const std::vector<ChatMessage>& messages,
                    bool add_generation_prompt = true) const;
  /// "chatml", "llama3", "phi3" or "gemma".
  const std::string& family() const { return family_; }

 private:
  std::string apply_gemma(const std::vector<ChatMessage>& messages,
                          bool add_generation_prompt) const;
  std::string family_;
  bool gemma_system_prefix_ = false;  ///< Gemma 3's: a system message prefixes the first turn
  std::string default_system_;        ///< ChatML's, or "" for none
  bool has_default_system_ = false;
  bool skip_empty_system_ = false;  ///< Phi-3.5's
};

}  // namespace te::gen
