#include "unicode.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>
#include <unicode/utf8.h>

#include "te/error.h"

namespace te::hf::detail {

std::u32string utf8_to_code_points(std::string_view text, const char* what) {
  std::u32string out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const auto n = static_cast<int32_t>(text.size());
  TE_CHECK(text.size() <= static_cast<std::size_t>(INT32_MAX), what, ": ", text.size(),
           " bytes of text; give at most 2 GiB at once");
  for (int32_t i = 0; i < n;) {
    const int32_t at = i;
    UChar32 c = 0;
    U8_NEXT(s, i, n, c);
    TE_CHECK(c >= 0, what, ": the text is not UTF-8 (an invalid sequence at byte ", at,
             "); give UTF-8 text");
    out.push_back(static_cast<char32_t>(c));
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  uint8_t buf[U8_MAX_LENGTH];
  int32_t n = 0;
  UBool error = false;
  U8_APPEND(buf, n, U8_MAX_LENGTH, static_cast<UChar32>(c), error);
  out.append(reinterpret_cast<const char*>(buf), static_cast<std::size_t>(n));
}

std::string to_utf8(std::u32string_view code_points) {
  std::string out;
  out.reserve(code_points.size());
  for (char32_t c : code_points) append_utf8(out, c);
  return out;
}

bool assigned_by(char32_t c, int major, int minor) {
  UVersionInfo age;
  u_charAge(static_cast<UChar32>(c), age);
  // Unassigned code points have age 0.0 (and no category that matters here).
  return age[0] < major || (age[0] == major && age[1] <= minor);
}

bool is_white_space(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)) != 0; }

bool is_punctuation_8(char32_t c) {
  return assigned_by(c, 8, 0) && (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_P_MASK) != 0;
}

bool is_other_8(char32_t c) {
  return assigned_by(c, 8, 0) && (U_GET_GC_MASK(static_cast<UChar32>(c)) &
                                  (U_GC_CC_MASK | U_GC_CF_MASK | U_GC_CO_MASK)) != 0;
}

bool is_nonspacing_mark_8(char32_t c) {
  return assigned_by(c, 8, 0) && u_charType(static_cast<UChar32>(c)) == U_NON_SPACING_MARK;
}

void append_lowercase(std::u32string& out, char32_t c) {
  // One code point alone: ICU's full mapping without neighbours (no final-sigma context).
  UChar src[2];
  int32_t n = 0;
  U16_APPEND_UNSAFE(src, n, static_cast<UChar32>(c));
  UChar dst[8];
  UErrorCode status = U_ZERO_ERROR;
  const int32_t m = u_strToLower(dst, 8, src, n, "", &status);
  TE_CHECK(U_SUCCESS(status), "internal: lowercasing U+", std::hex, static_cast<uint32_t>(c),
           " failed in ICU: ", u_errorName(status));
  for (int32_t i = 0; i < m;) {
    UChar32 d = 0;
    U16_NEXT(dst, i, m, d);
    out.push_back(static_cast<char32_t>(d));
  }
}

namespace {

std::u32string nfd_run(std::u32string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFDInstance(status);
  TE_CHECK(U_SUCCESS(status), "internal: ICU's NFD is unavailable: ", u_errorName(status));
  const icu::UnicodeString s = icu::UnicodeString::fromUTF32(
      reinterpret_cast<const UChar32*>(text.data()), static_cast<int32_t>(text.size()));
  const icu::UnicodeString d = n->normalize(s, status);
  TE_CHECK(U_SUCCESS(status), "internal: ICU's NFD failed: ", u_errorName(status));
  std::u32string out(static_cast<std::size_t>(d.countChar32()), U'\0');
  UErrorCode status2 = U_ZERO_ERROR;
  d.toUTF32(reinterpret_cast<UChar32*>(out.data()), static_cast<int32_t>(out.size()), status2);
  TE_CHECK(U_SUCCESS(status2), "internal: ICU's UTF-32 conversion failed");
  return out;
}

}  // namespace

std::u32string nfd_9(const std::u32string& text) {
  // Runs of code points Unicode 9.0 had go through ICU's NFD; later ones pass unchanged and
  // bound the runs (unicode-normalization-alignments 0.1.12 knows nothing of them).
  std::u32string out;
  out.reserve(text.size());
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && assigned_by(text[i], 9, 0)) continue;
    out += nfd_run(std::u32string_view(text).substr(start, i - start));
    if (i < text.size()) out += text[i];
    start = i + 1;
  }
  return out;
}

}  // namespace te::hf::detail
