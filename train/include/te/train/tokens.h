#pragma once

// Documents into tokens with a model's te::hf tokenizer (train/README.md):
//   - a text document: its ids (no special tokens unless asked) followed by the EOS id;
//   - a conversation: the chat template's rendering, tokenized without adding special tokens
//     (the template writes them), with a loss mask that is 1 exactly on each assistant message's
//     tokens and the end-of-turn token the template closes it with, as transformers'
//     apply_chat_template(return_assistant_tokens_mask=True) counts a template whose
//     {% generation %} block holds content + end-of-turn (transformers 5.23.0,
//     utils/chat_template_utils.py _render_with_assistant_indices and processing_utils.py
//     _adjust_assistant_masks_indices: every token overlapping the block's characters). No EOS
//     is appended: the template's end-of-turn closes the conversation.

#include <cstdint>
#include <string>
#include <vector>

#include "te/gen/chat_template.h"
#include "te/hf/tokenizer.h"

namespace te::train {

struct TokenizedDocument {
  std::vector<int64_t> ids;
  /// One per id: 1 where the token is a training target (every token of a text document; the
  /// assistant spans of a conversation).
  std::vector<uint8_t> mask;
};

TokenizedDocument tokenize_text(const te::hf::Tokenizer& tokenizer, const std::string& text,
                                int64_t eos_id, bool add_special_tokens = false);

/// `where` ("data.jsonl:7") names the conversation in errors: the template refusing it (te::gen's
/// message), a first message from the assistant, a rendering that is not a prefix of the
/// next one's, or pieces that tokenize differently from the whole text (the mask could not be
/// placed on token boundaries).
TokenizedDocument tokenize_chat(const te::hf::Tokenizer& tokenizer,
                                const te::gen::ChatTemplate& chat_template,
                                const std::vector<te::gen::ChatMessage>& messages,
                                const std::string& where);

/// A hash of the tokenizer's vocabulary (every id_to_token) and of the ids it gives a fixed probe
/// text (Unicode, digits, whitespace runs, special-token look-alikes), so that a change of
/// vocabulary or of splitting shows.
uint64_t tokenizer_fingerprint(const te::hf::Tokenizer& tokenizer);

/// FNV-1a, 64 bits, over `size` bytes, continuing from `hash`.
uint64_t fnv1a(const void* data, size_t size, uint64_t hash = 0xcbf29ce484222325ULL);

}  // namespace te::train
