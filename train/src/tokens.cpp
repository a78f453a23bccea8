// Documents into tokens (te/train/tokens.h): text with EOS, conversations with their assistant
// mask, and the tokenizer's fingerprint.

#include "te/train/tokens.h"

#include <utility>
#include <vector>

#include "te/error.h"

namespace te::train {
namespace {

using te::gen::ChatMessage;

struct Piece {
  std::string text;
  uint8_t mask;
};

bool starts_with(const std::string& s, const std::string& head) {
  return s.size() >= head.size() && s.compare(0, head.size(), head) == 0;
}

std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

std::string render(const te::gen::ChatTemplate& t, const std::vector<ChatMessage>& messages,
                   size_t count, bool generation_prompt, const std::string& where) {
  try {
    return t.apply({messages.begin(), messages.begin() + count}, generation_prompt);
  } catch (const te::Error& e) {
    TE_FAIL(where, ": the chat template refuses this conversation: ", e.what());
  }
}

// `next` continues `prev`: the rendering of a conversation's first messages is the start of the
// rendering of more of them, so each message's text is the difference.
std::string rest_after(const std::string& prev, const std::string& next, size_t message,
                       const std::string& where) {
  TE_CHECK(starts_with(next, prev), where, ": the chat template renders message ", message,
           " so that the conversation before it is not a prefix; te-train cannot find the "
           "assistant's tokens in this template's text");
  return next.substr(prev.size());
}

bool is_special(const te::hf::Tokenizer& tokenizer, int64_t id) {
  return tokenizer.decode({id}, true).empty() && !tokenizer.decode({id}, false).empty();
}

// The pieces of a conversation: each message's text (mask 0), except an assistant's, which is
// its generation prompt (0), its content (1) and what the template closes it with (a separate
// piece: its end-of-turn token gets 1 in tokenize_chat).
std::vector<Piece> chat_pieces(const te::gen::ChatTemplate& t,
                               const std::vector<ChatMessage>& messages, const std::string& where) {
  std::vector<Piece> pieces;
  std::string prev;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string full = render(t, messages, i + 1, false, where);
    if (messages[i].role != "assistant") {
      pieces.push_back({rest_after(prev, full, i, where), 0});
      prev = full;
      continue;
    }
    TE_CHECK(i > 0, where,
             ": the conversation starts with an assistant message; start it with "
             "a system or user message");
    const std::string prompt = render(t, messages, i, true, where);
    pieces.push_back({rest_after(prev, prompt, i, where), 0});
    const std::string turn = rest_after(prompt, full, i, where);
    const std::string& content = messages[i].content;
    size_t end = content.size();
    if (!starts_with(turn, content)) {  // a template that strips the content (Llama 3, Gemma)
      const std::string core = trimmed(content);
      const size_t at = turn.find(core);
      TE_CHECK(at != std::string::npos, where, ": message ", i,
               "'s content is not in the "
               "chat template's text for it; te-train cannot mark the assistant's tokens");
      end = at + core.size();
    }
    pieces.push_back({turn.substr(0, end), 1});
    pieces.push_back({turn.substr(end), 2});
    prev = full;
  }
  return pieces;
}

// `ids` (the tokens of `whole`), each 1 when its characters overlap one of `spans`; its characters
// are its decoded bytes, so te::Error when they do not add up to `whole` (a decoder that strips or
// adds text: there is no offset to go by).
TokenizedDocument mask_by_offsets(const te::hf::Tokenizer& tokenizer, const std::string& whole,
                                  const std::vector<int64_t>& ids,
                                  const std::vector<std::pair<size_t, size_t>>& spans,
                                  const std::string& where) {
  TokenizedDocument doc{ids, std::vector<uint8_t>(ids.size(), 0)};
  size_t at = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::string text = tokenizer.decode({ids[k]}, false);
    const bool same = whole.compare(at, text.size(), text) == 0;
    TE_CHECK(same, where,
             ": the tokenizer splits the chat template's text differently when its "
             "messages are tokenized apart, and its tokens do not decode to the text piece by "
             "piece; te-train cannot place the assistant mask on token boundaries for this "
             "tokenizer and template (use --data-format jsonl with a text field)");
    for (const auto& [begin, end] : spans)
      if (at < end && at + text.size() > begin) doc.mask[k] = 1;
    at += text.size();
  }
  TE_CHECK(at == whole.size(), where, ": the chat template's tokens decode to ", at,
           " bytes of its ", whole.size(), "; te-train cannot place the assistant mask");
  return doc;
}

}  // namespace

uint64_t fnv1a(const void* data, size_t size, uint64_t hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) hash = (hash ^ p[i]) * 0x100000001b3ULL;
  return hash;
}

TokenizedDocument tokenize_text(const te::hf::Tokenizer& tokenizer, const std::string& text,
                                int64_t eos_id, bool add_special_tokens) {
  TokenizedDocument doc;
  doc.ids = tokenizer.encode(text, {add_special_tokens, 0}).ids;
  doc.ids.push_back(eos_id);
  doc.mask.assign(doc.ids.size(), 1);
  return doc;
}

TokenizedDocument tokenize_chat(const te::hf::Tokenizer& tokenizer,
                                const te::gen::ChatTemplate& chat_template,
                                const std::vector<ChatMessage>& messages,
                                const std::string& where) {
  TokenizedDocument doc;
  std::string whole;
  std::vector<std::pair<size_t, size_t>> spans;  // the masked characters of `whole`
  for (const Piece& piece : chat_pieces(chat_template, messages, where)) {
    const std::vector<int64_t> ids = tokenizer.encode(piece.text, {false, 0}).ids;
    if (piece.mask == 1) spans.emplace_back(whole.size(), whole.size() + piece.text.size());
    // The closing piece: its tokens up to the end-of-turn (its first special token) count.
    bool closed = piece.mask != 2;
    size_t chars = whole.size();
    for (int64_t id : ids) {
      doc.ids.push_back(id);
      doc.mask.push_back(piece.mask == 1 || (piece.mask == 2 && !closed) ? 1 : 0);
      if (!closed) chars += tokenizer.decode({id}, false).size();
      if (!closed && is_special(tokenizer, id)) closed = true;
    }
    if (piece.mask == 2) spans.emplace_back(whole.size(), chars);
    whole += piece.text;
  }
  const std::vector<int64_t> reference = tokenizer.encode(whole, {false, 0}).ids;
  if (reference == doc.ids) return doc;
  // A token that spans a piece boundary ("\n " of "assistant\n" and " 42"): the whole text's
  // tokens, each masked when its characters overlap an assistant span, as transformers does.
  return mask_by_offsets(tokenizer, whole, reference, spans, where);
}

uint64_t tokenizer_fingerprint(const te::hf::Tokenizer& tokenizer) {
  const int64_t n = tokenizer.vocab_size();
  uint64_t hash = fnv1a(&n, sizeof n);
  for (int64_t id = 0; id < n; ++id) {
    const std::string token = tokenizer.id_to_token(id);
    hash = fnv1a(token.data(), token.size() + 1, hash);  // with its terminating NUL
  }
  static const char* const kProbe =
      "Hello, world! It's 2024-06-01: 12345 + 0.5 = ?\n\n  two  spaces\ttab\r\n"
      "ünïcödé Ελληνικά 日本語 한국어 🙂👍🏽 don't I'll <|im_start|> <s> "
      "</s> "
      "[CLS] "
      "<unk>";
  for (int64_t id : tokenizer.encode(kProbe, {false, 0}).ids) hash = fnv1a(&id, sizeof id, hash);
  return hash;
}

}  // namespace te::train
