#pragma once

// The Unicode te::hf's tokenizers need, from ICU: UTF-8 to code points and back, general
// categories, the White_Space property, full lowercase mapping and NFD, as Hugging Face
// tokenizers 0.23.3 (Rust) applies them. Its BERT normalizer and pre-tokenizer read categories
// from the unicode_categories 0.1.1 crate, whose tables are Unicode 8.0, and decompose with
// unicode-normalization-alignments 0.1.12 (Unicode 9.0): the *_8 and *_9 functions answer as
// those tables do (a code point assigned later has no category there), from ICU's character age.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace te::hf::detail {

/// The code points of UTF-8 `text`; te::Error naming `what` and the byte offset of the first
/// invalid sequence.
std::u32string utf8_to_code_points(std::string_view text, const char* what);
/// UTF-8 of code points (all valid scalar values: they come from utf8_to_code_points).
std::string to_utf8(std::u32string_view code_points);
void append_utf8(std::string& out, char32_t c);

/// Rust's char::is_whitespace (the White_Space property).
bool is_white_space(char32_t c);
/// True when `c` was assigned by Unicode major.minor.
bool assigned_by(char32_t c, int major, int minor);
/// Category P* (Pc, Pd, Ps, Pe, Pi, Pf, Po) in Unicode 8.0.
bool is_punctuation_8(char32_t c);
/// unicode_categories' is_other: Cc, Cf or Co (not Cn, not Cs) in Unicode 8.0.
bool is_other_8(char32_t c);
/// Category Mn (nonspacing mark) in Unicode 8.0.
bool is_nonspacing_mark_8(char32_t c);
/// Rust's char::to_lowercase: the full (one-to-many) lowercase mapping of one code point, no
/// context (a final sigma stays σ).
void append_lowercase(std::u32string& out, char32_t c);
/// Canonical decomposition (NFD) of `text` as Unicode 9.0 defines it.
std::u32string nfd_9(const std::u32string& text);

}  // namespace te::hf::detail
