#pragma once

// What a model's files say about generating with it: its end-of-sequence tokens and its chat
// template (GGUF metadata tokenizer.ggml.eos_token_id and tokenizer.chat_template; a Hugging Face
// folder's generation_config.json / config.json eos_token_id and tokenizer_config.json's
// chat_template or chat_template.jinja), and the chat templates te-cpp applies. There is no
// Jinja library in Debian's C++ packages, so te-cpp recognises the template families of the
// models it serves and refuses any other by name:
//   - ChatML (SmolLM2, Qwen2/3, ...): <|im_start|>{role}\n{content}<|im_end|>\n per message,
//     a default system message when the template adds one before a first non-system message,
//     and <|im_start|>assistant\n as the generation prompt;
//   - Llama 3: <|begin_of_text|>, then <|start_header_id|>{role}<|end_header_id|>\n\n{content}
//     <|eot_id|> per message (content stripped), <|start_header_id|>assistant<|end_header_id|>\n\n.
// tests/interop/check_generate.py holds both to transformers' apply_chat_template.

#include <cstdint>
#include <string>
#include <vector>

namespace te::hf {

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
  /// "chatml" or "llama3".
  const std::string& family() const { return family_; }

 private:
  std::string family_;
  std::string default_system_;  ///< ChatML's, or "" for none
  bool has_default_system_ = false;
};

/// The generation settings of a model folder or GGUF file.
struct GenerationDefaults {
  /// The tokens that end generation (eos_token_id, one or a list).
  std::vector<int64_t> eos_token_ids;
  /// The chat template as written ("" when the model has none).
  std::string chat_template;
};

/// Reads them from `dir_or_gguf`; te::Error naming a file that cannot be read or a field of the
/// wrong type.
GenerationDefaults read_generation_defaults(const std::string& dir_or_gguf);

}  // namespace te::hf
