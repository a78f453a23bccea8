#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "te/runtime/runtime.h"
#include "te/serve/generation.h"
#include "te/serve/openai.h"
#include "te/serve/service.h"

namespace te::serve {

using json = nlohmann::json;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// The "logprobs" of a choice: completions' {tokens, token_logprobs, top_logprobs, text_offset}
// or chat's {content: [{token, logprob, bytes, top_logprobs}]}; null when not asked for.
json logprobs_json(const CompletionRequest& r, const std::vector<TokenInfo>& tokens) {
  if (r.logprobs < 0) return nullptr;
  if (r.chat) {
    json content = json::array();
    for (const TokenInfo& t : tokens) {
      json top = json::array();
      for (const auto& [text, lp] : t.top) {
        top.push_back({{"token", text}, {"logprob", lp}, {"bytes", bytes_of(text)}});
      }
      content.push_back({{"token", t.text},
                         {"logprob", t.logprob},
                         {"bytes", bytes_of(t.bytes)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json l = {{"tokens", json::array()},
            {"token_logprobs", json::array()},
            {"top_logprobs", json::array()},
            {"text_offset", json::array()}};
  for (const TokenInfo& t : tokens) {
    l["tokens"].push_back(t.text);
    l["token_logprobs"].push_back(t.logprob);
    json top = json::object();
    for (const auto& [text, lp] : t.top) top[text] = lp;
    l["top_logprobs"].push_back(top);
    l["text_offset"].push_back(t.offset);
  }
  return l;
}

// OpenAI's usage; no prompt token comes from a cache yet (cached_tokens 0).
json usage(const GenerationStream& s) {
  return {{"prompt_tokens", s.prompt_tokens()},
          {"completion_tokens", s.completion_tokens()},
          {"total_tokens", s.prompt_tokens() + s.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", 0}}}};
}

json envelope(const GenerationStream& s, const std::string& model, const char* object) {
  return {{"id", s.id()},
          {"object", object},
          {"created", s.created()},
          {"model", model},
          {"system_fingerprint", system_fingerprint()}};
}

}  // namespace

std::string encode_response(const GenerationStream& s, const std::string& model,
                            const std::string& text, const std::vector<TokenInfo>& tokens,
                            const std::string& finish_reason) {
  const CompletionRequest& r = s.request();
  json out = envelope(s, model, r.chat ? "chat.completion" : "text_completion");
  json choice = {
      {"index", 0}, {"logprobs", logprobs_json(r, tokens)}, {"finish_reason", finish_reason}};
  if (r.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  out["choices"] = json::array({choice});
  out["usage"] = usage(s);
  return dump(out);
}

std::string encode_event(const GenerationStream& s, const std::string& model, const Piece& piece,
                         bool first, bool usage_only) {
  const CompletionRequest& r = s.request();
  json out = envelope(s, model, r.chat ? "chat.completion.chunk" : "text_completion");
  if (usage_only) {
    out["choices"] = json::array();
    out["usage"] = usage(s);
  } else {
    json choice = {
        {"index", 0},
        {"logprobs", piece.tokens.empty() ? json(nullptr) : logprobs_json(r, piece.tokens)},
        {"finish_reason", piece.finish_reason.empty() ? json(nullptr) : json(piece.finish_reason)}};
    if (r.chat) {
      json delta = json::object();
      if (first) delta["role"] = "assistant";
      if (first || !piece.text.empty()) delta["content"] = piece.text;
      choice["delta"] = delta;
    } else {
      choice["text"] = piece.text;
    }
    out["choices"] = json::array({choice});
    if (r.include_usage) out["usage"] = nullptr;  // as OpenAI: only the last event carries it
  }
  return "data: " + dump(out) + "\n\n";
}

std::string openai_error_body(int status, const std::string& message, const std::string& param,
                              const std::string& code) {
  const char* type = status == 503   ? "service_unavailable"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  return dump({{"error",
                {{"message", message},
                 {"type", type},
                 {"param", param.empty() ? json(nullptr) : json(param)},
                 {"code", code.empty() ? json(nullptr) : json(code)}}}});
}

std::string openai_error_body(const HttpError& e) {
  return openai_error_body(e.status, e.what(), e.param, e.code);
}

const std::string& system_fingerprint() {
  static const std::string kFingerprint = [] {
    std::string info = te::build_info();  // "te-cpp <version>\n..."
    info = info.substr(0, info.find('\n'));
    for (char& c : info) {
      if (c == ' ') c = '-';
    }
    return info;
  }();
  return kFingerprint;
}

std::string encode_embeddings(const Embeddings& e, bool base64, const std::string& model) {
  const at::Tensor v = e.vectors.to(at::kFloat).contiguous();
  json data = json::array();
  int64_t tokens = 0;
  for (int64_t i = 0; i < v.size(0); ++i) {
    const float* row = v[i].data_ptr<float>();
    json item = {{"object", "embedding"}, {"index", i}};
    if (base64) {
      // Little-endian float32, as OpenAI's API and its clients' decoders have it.
      item["embedding"] = base64_encode(std::string_view(reinterpret_cast<const char*>(row),
                                                         static_cast<std::size_t>(v.size(1)) * 4));
    } else {
      item["embedding"] = std::vector<float>(row, row + v.size(1));
    }
    data.push_back(std::move(item));
    tokens += e.tokens[static_cast<std::size_t>(i)];
  }
  return json{{"object", "list"},
              {"data", data},
              {"model", model},
              {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}},
              {"truncated", e.truncated}}
      .dump();
}

std::string SseEvents::next(const GenerationStream& stream, const std::string& model,
                            const Piece& piece) {
  std::string out;
  if (first_ && stream.request().chat) {
    out = encode_event(stream, model, Piece{}, true);
    first_ = false;
  }
  if (piece.text.empty() && piece.tokens.empty() && piece.finish_reason.empty() && !first_) {
    return out;  // a held-back character: nothing more to send yet
  }
  if (!piece.finish_reason.empty() && (!piece.text.empty() || !piece.tokens.empty())) {
    Piece last = piece;  // its text and tokens first, the finish_reason in an event of its own
    last.finish_reason.clear();
    out += encode_event(stream, model, last, first_);
    first_ = false;
  }
  Piece finish;
  if (!piece.finish_reason.empty()) finish.finish_reason = piece.finish_reason;
  out += encode_event(stream, model, piece.finish_reason.empty() ? piece : finish, first_);
  first_ = false;
  if (!piece.finish_reason.empty()) {
    if (stream.request().include_usage) out += encode_event(stream, model, piece, false, true);
    out += "data: [DONE]\n\n";
  }
  return out;
}

}  // namespace te::serve
