// te::gen::request_problem: every check of a generation request, in one place (the Engine's add
// and te-serve's submit both ask it).

#include "te/gen/request.h"

#include <sstream>

#include "te/error.h"

namespace te::gen {

namespace {

constexpr int64_t kMaxTopLogprobs = 20;  // OpenAI's bound on top_logprobs

template <class... Parts>
BadField bad(const std::string& field, const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  return BadField{field, message.str()};
}

// The first token id of `ids` outside [0, vocab), as "<what> token X is outside ... (<name>[i])".
std::optional<BadField> outside_vocabulary(const std::vector<int64_t>& ids, int64_t vocab,
                                           const std::string& field, const char* what) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return bad(field, what, " token ", ids[i], " is outside the vocabulary of ", vocab,
                 " tokens (", field, "[", i, "])");
    }
  }
  return std::nullopt;
}

// The prompt against the vocabulary and the context.
std::optional<BadField> prompt_problem(const std::vector<int64_t>& prompt, const RequestLimits& l) {
  if (prompt.empty()) return bad("prompt", "the prompt has no tokens");
  if (auto outside = outside_vocabulary(prompt, l.vocab_size, "prompt", "prompt")) return outside;
  const auto length = static_cast<int64_t>(prompt.size());
  if (length < l.max_sequence_length) return std::nullopt;
  BadField b = l.context.empty()
                   ? bad("prompt", "the prompt has ", length, " tokens; max_sequence_length ",
                         l.max_sequence_length, " leaves no room to generate")
                   : bad("prompt", "the prompt is ", length, " tokens; ", l.context, " holds ",
                         l.max_sequence_length, ", prompt and generated tokens together");
  b.code = "context_length_exceeded";
  return b;
}

}  // namespace

std::optional<BadField> request_problem(const std::vector<int64_t>& prompt,
                                        const GenerateOptions& o, const RequestLimits& l) {
  if (auto problem = prompt_problem(prompt, l)) return problem;
  const std::string& max_tokens = l.max_tokens_field;
  if (o.max_tokens < 1) return bad(max_tokens, max_tokens, " ", o.max_tokens, " must be >= 1");
  const int64_t room = l.max_sequence_length - static_cast<int64_t>(prompt.size());
  if (l.max_tokens_within_context && o.max_tokens > room) {
    BadField b =
        bad(max_tokens, "\"", max_tokens, "\" is ", o.max_tokens, " but the prompt's ",
            prompt.size(), " tokens leave ", room, " of ",
            l.context.empty() ? "max_sequence_length" : l.context, " of ", l.max_sequence_length);
    b.code = "context_length_exceeded";
    return b;
  }
  if (o.top_logprobs < 0 || o.top_logprobs > kMaxTopLogprobs) {
    return bad("top_logprobs", "top_logprobs ", o.top_logprobs, " must be in [0, ", kMaxTopLogprobs,
               "]");
  }
  if (auto sampling = sampling_problem(o.sampling, "sampling")) return sampling;
  if (auto outside = outside_vocabulary(o.stop_token_ids, l.vocab_size, "stop_token_ids", "stop")) {
    return outside;
  }
  for (std::size_t i = 0; i < o.stop.size(); ++i) {
    if (o.stop[i].empty()) return bad("stop", "stop[", i, "] is an empty string");
  }
  return std::nullopt;
}

void check_request(const std::vector<int64_t>& prompt, const GenerateOptions& options,
                   const RequestLimits& limits, const std::string& who) {
  if (const std::optional<BadField> problem = request_problem(prompt, options, limits)) {
    TE_FAIL(who, ": ", problem->message);
  }
}

}  // namespace te::gen
