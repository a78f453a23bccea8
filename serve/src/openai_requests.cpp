#include <algorithm>
#include <cstdint>

#include "json_body.h"
#include "te/serve/openai.h"

namespace te::serve {

using namespace detail;  // json_body.h

EmbeddingsRequest decode_embeddings(std::string_view body, std::size_t max_inputs,
                                    int64_t dimensions) {
  const json doc = parse_object(body, "{\"input\": \"...\"} or {\"input\": [\"...\"]}");
  EmbeddingsRequest r;
  for (const auto& [key, value] : doc.items()) {
    if (key == "input" || key == "model" || key == "encoding_format" || key == "dimensions" ||
        key == "user") {
      continue;
    }
    throw HttpError(400, "\"" + key +
                             "\" is not a field of an embeddings request (input, "
                             "model, encoding_format, dimensions, user)");
  }
  if (const auto m = doc.find("model"); m != doc.end() && !m->is_null()) {
    r.model = utf8_string(*m, "model");
  }
  const auto input = doc.find("input");
  if (input == doc.end()) {
    throw HttpError(400, "the body has no \"input\"; send {\"input\": \"...\"} or a list");
  }
  if (input->is_string()) {
    r.input = strings(json::array({*input}), "input", max_inputs, "input");
  } else if (input->is_array()) {
    if (!input->empty() && !(*input)[0].is_string()) {
      throw HttpError(400, "\"input\" holds " + std::string((*input)[0].type_name()) +
                               "s; this server embeds text: send strings, not token ids");
    }
    r.input = strings(*input, "input", max_inputs, "input");
  } else {
    throw HttpError(400, "\"input\" is a JSON " + std::string(input->type_name()) +
                             "; send a string or a list of strings");
  }
  for (std::size_t i = 0; i < r.input.size(); ++i) {
    if (r.input[i].empty()) {
      throw HttpError(400, "input[" + std::to_string(i) + "] is empty; send text to embed");
    }
  }
  if (const auto f = doc.find("encoding_format"); f != doc.end() && !f->is_null()) {
    if (*f != "float" && *f != "base64") {
      throw HttpError(400, "\"encoding_format\" is " + f->dump() + "; use \"float\" or \"base64\"");
    }
    r.base64 = *f == "base64";
  }
  if (const auto d = doc.find("dimensions"); d != doc.end() && !d->is_null()) {
    if (!d->is_number_integer() || d->get<int64_t>() != dimensions) {
      throw HttpError(400, "\"dimensions\" is " + d->dump() + ": this model's embeddings have " +
                               std::to_string(dimensions) +
                               " dimensions and te-serve does not shorten them; leave it out");
    }
  }
  return r;
}

namespace {

constexpr int64_t kMaxTokens = int64_t{1} << 30;

// A field OpenAI defines that te-serve does not implement: accepted only when it asks for
// nothing (`inert` says whether the value does).
void unsupported(const json& doc, const char* key, bool (*inert)(const json&),
                 const char* instead) {
  const json& v = field(doc, key);
  if (v.is_null() || inert(v)) return;
  throw HttpError(
      400,
      "\"" + std::string(key) + "\" is " + v.dump() + ": te-serve does not support it; " + instead,
      key);
}

std::string message_content(const json& content, const std::string& where) {
  if (content.is_string()) return utf8_string(content, where);
  if (!content.is_array()) {
    bad_field(where, "is a JSON " + std::string(content.type_name()) +
                         "; send a string or a list of {\"type\": \"text\", \"text\": ...} parts");
  }
  std::string text;
  for (std::size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!part.is_object() || field(part, "type") != "text") {
      bad_field(at,
                "is not a text part; te-serve's models read text only ({\"type\": \"text\", "
                "\"text\": ...})");
    }
    text += utf8_string(field(part, "text"), at + ".text");
  }
  return text;
}

// A chat request's "messages".
void read_messages(const json& doc, CompletionRequest& r) {
  const json& m = field(doc, "messages");
  if (m.is_null())
    bad_field("messages", "is missing; send [{\"role\": \"user\", \"content\": \"...\"}]");
  if (!m.is_array() || m.empty()) bad_field("messages", "must be a non-empty list of messages");
  for (std::size_t i = 0; i < m.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m[i].is_object())
      bad_field(where,
                "is a JSON " + std::string(m[i].type_name()) + "; send {\"role\", \"content\"}");
    std::string role = utf8_string(field(m[i], "role"), where + ".role");
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant") {
      bad_field(where + ".role",
                "is \"" + role + "\"; use system, user or assistant (te-serve has no tools)");
    }
    if (const json& calls = field(m[i], "tool_calls"); !calls.is_null() && !calls.empty()) {
      bad_field(where + ".tool_calls", "is not supported: te-serve has no tool calls");
    }
    r.messages.push_back({role, message_content(field(m[i], "content"), where + ".content")});
  }
}

// A completion request's "prompt": text, or a list of token ids.
void read_prompt(const json& doc, CompletionRequest& r) {
  const json& p = field(doc, "prompt");
  if (p.is_null()) bad_field("prompt", "is missing; send {\"prompt\": \"...\"}");
  if (p.is_string()) {
    r.prompt = utf8_string(p, "prompt");
  } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (!p[i].is_number_integer() || p[i].get<int64_t>() < 0) {
        bad_field("prompt[" + std::to_string(i) + "]",
                  "is " + p[i].dump() + "; a list of token ids holds non-negative integers");
      }
      r.prompt_ids.push_back(p[i].get<int64_t>());
    }
  } else if (p.is_array() && p.size() == 1) {
    r.prompt = utf8_string(p[0], "prompt[0]");
  } else {
    bad_field("prompt", p.is_array() ? "holds " + std::to_string(p.size()) +
                                           " prompts; te-serve takes one per request (n = 1)"
                                     : "is a JSON " + std::string(p.type_name()) +
                                           "; send a string or a list of token ids");
  }
  if (r.prompt.empty() && r.prompt_ids.empty())
    bad_field("prompt", "is empty; send text to continue");
}

// "model", and "max_tokens" (chat: or "max_completion_tokens").
void read_model_and_length(const json& doc, CompletionRequest& r) {
  const bool chat = r.chat;
  if (const json& m = field(doc, "model"); !m.is_null()) r.model = utf8_string(m, "model");
  r.max_tokens = integer_field(doc, "max_tokens", 1, kMaxTokens);
  if (chat) {
    if (auto m = integer_field(doc, "max_completion_tokens", 1, kMaxTokens)) {
      if (r.max_tokens && *r.max_tokens != *m) {
        bad_field("max_completion_tokens", "is " + std::to_string(*m) + " but \"max_tokens\" is " +
                                               std::to_string(*r.max_tokens) +
                                               "; send one of them");
      }
      r.max_tokens = m;
      r.max_tokens_field = "max_completion_tokens";
    }
  }
}

// The sampling fields, each left unset when absent (the model's default then applies), and n.
void read_sampling(const json& doc, CompletionRequest& r) {
  r.temperature = number_field(doc, "temperature", 0, 2);
  r.top_p = number_field(doc, "top_p", 0, 1, /*lo_open=*/true);
  r.min_p = number_field(doc, "min_p", 0, 1);
  r.repetition_penalty = number_field(doc, "repetition_penalty", 0, 100, true);
  r.presence_penalty = number_field(doc, "presence_penalty", -2, 2);
  r.frequency_penalty = number_field(doc, "frequency_penalty", -2, 2);
  if (auto k = integer_field(doc, "top_k", -1, kMaxTokens)) r.top_k = std::max<int64_t>(0, *k);
  if (const json& s = field(doc, "seed"); !s.is_null()) {
    if (!s.is_number_integer())
      bad_field("seed", "is a JSON " + std::string(s.type_name()) + "; send an integer");
    r.seed = s.is_number_unsigned() ? s.get<uint64_t>() : static_cast<uint64_t>(s.get<int64_t>());
  }
  if (auto n = integer_field(doc, "n", 1, kMaxTokens); n && *n != 1) {
    bad_field("n", "is " + std::to_string(*n) +
                       "; te-serve returns one choice per request: send n copies of it");
  }
}

// "stop" and "stop_token_ids".
void read_stops(const json& doc, CompletionRequest& r) {
  if (const json& s = field(doc, "stop"); !s.is_null()) {
    const json list = s.is_string() ? json::array({s}) : s;
    if (!list.is_array())
      bad_field("stop",
                "is a JSON " + std::string(s.type_name()) + "; send a string or a list of them");
    if (list.size() > 4)
      bad_field("stop", "holds " + std::to_string(list.size()) + " strings; at most 4");
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string where = s.is_string() ? "stop" : "stop[" + std::to_string(i) + "]";
      std::string text = utf8_string(list[i], where);
      if (text.empty()) bad_field(where, "is empty");
      r.stop.push_back(std::move(text));
    }
  }
  if (const json& ids = field(doc, "stop_token_ids"); !ids.is_null()) {
    if (!ids.is_array()) bad_field("stop_token_ids", "must be a list of token ids");
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (!ids[i].is_number_integer() || ids[i].get<int64_t>() < 0) {
        bad_field("stop_token_ids[" + std::to_string(i) + "]",
                  "is " + ids[i].dump() + "; send a token id");
      }
      r.stop_token_ids.push_back(ids[i].get<int64_t>());
    }
  }
}

// "ignore_eos", "stream", "stream_options" and the log-probabilities asked for.
void read_output(const json& doc, CompletionRequest& r) {
  const bool chat = r.chat;
  r.ignore_eos = bool_field(doc, "ignore_eos").value_or(false);
  r.stream = bool_field(doc, "stream").value_or(false);
  if (const json& o = field(doc, "stream_options"); !o.is_null()) {
    if (!o.is_object()) bad_field("stream_options", "must be an object");
    if (!r.stream) bad_field("stream_options", "is only allowed with \"stream\": true");
    r.include_usage = bool_field(o, "include_usage").value_or(false);
  }
  if (chat) {
    const bool logprobs = bool_field(doc, "logprobs").value_or(false);
    const auto top = integer_field(doc, "top_logprobs", 0, 20);
    if (top && !logprobs) bad_field("top_logprobs", "needs \"logprobs\": true");
    if (logprobs) r.logprobs = top.value_or(0);
  } else {
    if (auto n = integer_field(doc, "logprobs", 0, 5)) r.logprobs = *n;
  }
}

// The fields OpenAI and vLLM define that te-serve does not implement, refused when they ask for
// something.
void refuse_unsupported(const json& doc, bool chat) {
  auto is_one = [](const json& v) { return v.is_number_integer() && v.get<int64_t>() == 1; };
  auto is_false = [](const json& v) { return v.is_boolean() && !v.get<bool>(); };
  auto is_empty = [](const json& v) {
    return (v.is_object() || v.is_array() || v.is_string()) && v.empty();
  };
  unsupported(doc, "logit_bias", is_empty, "leave it out");
  // vLLM's extensions te-serve does not implement, refused when they would change the answer.
  auto is_true = [](const json& v) { return v.is_boolean() && v.get<bool>(); };
  auto is_null = [](const json& v) { return v.is_null(); };
  auto is_zero_int = [](const json& v) { return v.is_number_integer() && v.get<int64_t>() == 0; };
  unsupported(doc, "min_tokens", is_zero_int, "leave it out");
  unsupported(doc, "include_stop_str_in_output", is_false, "the stop string is never returned");
  unsupported(doc, "skip_special_tokens", is_true, "special tokens are left out of the text");
  unsupported(doc, "prompt_logprobs", is_null, "te-serve returns the generated tokens' only");
  for (const char* key :
       {"guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs"}) {
    unsupported(doc, key, is_null, "te-serve has no constrained decoding");
  }
  if (chat) {
    unsupported(doc, "add_generation_prompt", is_true, "the assistant's turn is always opened");
    unsupported(doc, "continue_final_message", is_false, "the assistant's turn is always opened");
    unsupported(doc, "echo", is_false, "the prompt is not returned with the text");
    unsupported(
        doc, "tool_choice",
        [](const json& v) { return v.is_string() && v.get<std::string>() == "none"; },
        "te-serve has no tool calls");
    unsupported(doc, "tools", is_empty, "te-serve has no tool calls");
    unsupported(doc, "functions", is_empty, "te-serve has no tool calls");
    unsupported(
        doc, "response_format",
        [](const json& v) { return v.is_object() && field(v, "type") == "text"; },
        "only {\"type\": \"text\"}");
  } else {
    unsupported(doc, "echo", is_false, "the prompt is not returned with the text");
    unsupported(doc, "suffix", is_empty, "te-serve has no insertion mode");
    unsupported(doc, "best_of", is_one, "te-serve returns one choice per request");
  }
}

}  // namespace

CompletionRequest decode_completion(std::string_view body, bool chat) {
  const json doc =
      parse_object(body, chat ? "{\"messages\": [{\"role\": \"user\", \"content\": \"...\"}]}"
                              : "{\"prompt\": \"...\"}");
  CompletionRequest r;
  r.chat = chat;
  chat ? read_messages(doc, r) : read_prompt(doc, r);
  read_model_and_length(doc, r);
  read_sampling(doc, r);
  read_stops(doc, r);
  read_output(doc, r);
  refuse_unsupported(doc, chat);
  return r;
}

}  // namespace te::serve
