// te::gen::ChatTemplate: the ChatML, Llama 3, Phi-3 and Gemma template families recognised in a
// model's chat_template, and the prompts they write.

#include "te/gen/chat_template.h"

#include "te/error.h"

namespace te::gen {

namespace {

bool has(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

std::string trimmed(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\n\r");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t\n\r") - first + 1);
}

}  // namespace

ChatTemplate ChatTemplate::recognise(const std::string& jinja, const std::string& where) {
  ChatTemplate t;
  if (has(jinja, "<|im_start|>") && has(jinja, "<|im_end|>") &&
      has(jinja, "add_generation_prompt") && !has(jinja, "tools") && !has(jinja, "<think>")) {
    t.family_ = "chatml";
    // A default system message before a first message that is not one (SmolLM2's).
    const std::string opening = "'<|im_start|>system\n";
    const auto at = jinja.find(opening);
    if (has(jinja, "messages[0]['role'] != 'system'") && at != std::string::npos) {
      const auto begin = at + opening.size();
      const auto end = jinja.find("<|im_end|>", begin);
      TE_CHECK(end != std::string::npos, "chat template of ", where,
               ": its default system message has no end");
      t.default_system_ = jinja.substr(begin, end - begin);
      t.has_default_system_ = true;
    }
    return t;
  }
  if (has(jinja, "<|start_header_id|>") && has(jinja, "<|eot_id|>") &&
      has(jinja, "add_generation_prompt") && !has(jinja, "tools") &&
      !has(jinja, "Cutting Knowledge")) {
    t.family_ = "llama3";
    return t;
  }
  // Phi-3 / Phi-3.5 (the form with a system turn and add_generation_prompt; the earliest
  // Phi-3 templates, which fold the generation prompt into each user turn, are not this one).
  if (has(jinja, "'<|system|>") && has(jinja, "'<|user|>") && has(jinja, "'<|assistant|>") &&
      has(jinja, "<|end|>") && has(jinja, "{% if add_generation_prompt %}") &&
      has(jinja, "message['role'] == 'system'") && !has(jinja, "tools")) {
    t.family_ = "phi3";
    // Phi-3.5's leaves out a system message with empty content.
    t.skip_empty_system_ = has(jinja, "message['role'] == 'system' and message['content']");
    return t;
  }
  if (has(jinja, "<start_of_turn>") && has(jinja, "<end_of_turn>") &&
      has(jinja, "add_generation_prompt") && !has(jinja, "tools")) {
    t.family_ = "gemma";
    // Gemma 3's folds a system message into the first user turn; Gemma 1's and 2's refuse one.
    t.gemma_system_prefix_ = has(jinja, "first_user_prefix");
    return t;
  }
  throw Error(
      "chat template of " + where +
      " is not one te-cpp applies (it recognises ChatML, Llama 3, Phi-3 and Gemma templates "
      "without tools; there is no Jinja engine): give the prompt as text instead of "
      "--chat");
}

std::string ChatTemplate::apply(const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) const {
  TE_CHECK(!messages.empty(), "chat template: no messages");
  for (const ChatMessage& m : messages) {
    TE_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant",
             "chat template: role '", m.role, "' is not system, user or assistant");
  }
  std::string out;
  if (family_ == "chatml") {
    if (has_default_system_ && messages.front().role != "system") {
      out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
    }
    for (const ChatMessage& m : messages) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    }
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
  }
  if (family_ == "phi3") {
    // Without a generation prompt the template ends with eos_token, which it does not name.
    TE_CHECK(add_generation_prompt,
             "chat template: a Phi-3 conversation without the generation prompt ends with the "
             "tokenizer's eos_token, which the template does not hold; ask for the prompt");
    for (const ChatMessage& m : messages) {
      if (m.role == "system" && skip_empty_system_ && m.content.empty()) continue;
      out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
    }
    return out + "<|assistant|>\n";
  }
  if (family_ == "gemma") return apply_gemma(messages, add_generation_prompt);
  out = "<|begin_of_text|>";
  for (const ChatMessage& m : messages) {
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trimmed(m.content) +
           "<|eot_id|>";
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// Gemma's templates (gemma-2-2b-it's and gemma-3-1b-it's tokenizer_config.json): <bos>, then
// <start_of_turn>{user | model}\n{content, trimmed}<end_of_turn>\n per message, user first and
// alternating, <start_of_turn>model\n to generate. A system message is refused (Gemma 1, 2) or
// becomes the first turn's prefix, content + "\n\n", untrimmed (Gemma 3).
std::string ChatTemplate::apply_gemma(const std::vector<ChatMessage>& messages,
                                      bool add_generation_prompt) const {
  std::string out = "<bos>", prefix;
  std::size_t first = 0;
  if (messages.front().role == "system") {
    TE_CHECK(gemma_system_prefix_,
             "chat template (gemma): this template takes no system message (it raises 'System "
             "role not supported'); give the instruction in the first user message");
    prefix = messages.front().content + "\n\n";
    first = 1;
  }
  for (std::size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool user_turn = (i - first) % 2 == 0;
    TE_CHECK(m.role == (user_turn ? "user" : "assistant"), "chat template (gemma): message ", i,
             " is '", m.role, "' but the roles must alternate user/assistant/... from the first");
    out += "<start_of_turn>" + std::string(user_turn ? "user" : "model") + "\n" +
           (i == first ? prefix : "") + trimmed(m.content) + "<end_of_turn>\n";
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

}  // namespace te::gen
