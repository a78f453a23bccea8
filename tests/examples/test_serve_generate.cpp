// te-serve with a decoder model as a client sees it: a small random Llama saved as a Hugging Face
// folder (config.json, model.safetensors, a character-level byte BPE tokenizer.json, a ChatML
// template), served on a free loopback port. Concurrent streams each give the text the same
// request gives alone (greedy), in valid server-sent events; a client that disconnects has its
// sequence cancelled and its KV pages freed at once (the metrics say so); a full queue is 503 with
// Retry-After; bad requests are 400 naming the field; SIGTERM mid-stream finishes the stream and
// exits 0. (tests/interop/check_serve_generate.py drives SmolLM2 through the official openai
// client.)
#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../hf/bpe_json.h"
#include "../temp_dir.h"
#include "server_process.h"
#include "te/hf/causal_lm.h"
#include "te/nn/init.h"
#include "te/nn/safetensors.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using te::test::expect_openai_error;
using te::test::Server;

constexpr int64_t kContext = 2048;

// A random Llama (4 layers, GQA) over printable ASCII: a byte-level BPE of single characters
// (ids 0-94 for bytes 32-126, 'Ġ' standing for the space) and <|endoftext|> (95, the eos).
// Large enough that a long stream takes seconds, small enough to load at once. With `experts`,
// a Qwen3-MoE of as many experts (2 per token) on the same attention.
void write_model(const fs::path& dir, int64_t experts = 0) {
  fs::create_directories(dir);
  json config = {{"model_type", "llama"},
                 {"architectures", {"LlamaForCausalLM"}},
                 {"vocab_size", 96},
                 {"hidden_size", 128},
                 {"intermediate_size", 256},
                 {"num_hidden_layers", 4},
                 {"num_attention_heads", 4},
                 {"num_key_value_heads", 2},
                 {"max_position_embeddings", kContext},
                 {"rms_norm_eps", 1e-5},
                 {"hidden_act", "silu"},
                 {"tie_word_embeddings", false},
                 {"eos_token_id", 95},
                 {"rope_theta", 10000.0}};
  if (experts > 0) {
    config.update({{"model_type", "qwen3_moe"},
                   {"architectures", {"Qwen3MoeForCausalLM"}},
                   {"num_experts", experts},
                   {"num_experts_per_tok", 2},
                   {"moe_intermediate_size", 64},
                   {"norm_topk_prob", true}});
  }
  std::ofstream(dir / "config.json") << config.dump();
  te::nn::manual_seed(5);
  te::hf::CausalLM model(te::hf::parse_causal_lm_config(config.dump(), "config.json"));
  std::map<std::string, at::Tensor> whole;
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : model->named_parameters()) {
      // Larger weights than the init's, so the logits are far apart and argmax is no coin toss.
      whole[p.key()] = p.value().dim() >= 2 ? p.value().detach() * 3 : p.value().detach();
    }
  }
  te::nn::write_safetensors((dir / "model.safetensors").string(),
                            te::hf::to_hf_tensors(model->config, whole));
  std::vector<std::string> tokens;
  for (int b = 32; b < 127; ++b) tokens.push_back(b == 32 ? "\u0120" : std::string(1, char(b)));
  tokens.push_back("<|endoftext|>");
  const json tokenizer = te::test::byte_level_bpe_json(tokens, {}, "<|endoftext|>", 95);
  std::ofstream(dir / "tokenizer.json") << tokenizer.dump();
  // A ChatML template (te-cpp recognises the family; the markers are plain characters here).
  const std::string chatml =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\\n' }}{% endif %}";
  std::ofstream(dir / "tokenizer_config.json") << json{{"chat_template", chatml}}.dump();
}

class ServeGenerate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new te::test::TempDir("te_serve_generate");
    write_model(dir_->path() / "tiny-llama");
    write_model(dir_->path() / "tiny-moe", 4);
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string model() { return (dir_->path() / "tiny-llama").string(); }
  static te::test::TempDir* dir_;
};
te::test::TempDir* ServeGenerate::dir_ = nullptr;

httplib::Result post(const Server& s, const std::string& path, const json& body) {
  httplib::Client c = s.client();
  return c.Post(path.c_str(), body.dump(), "application/json");
}

// The events of a streamed body, checked as server-sent events: "data: <json>\n\n" each, the
// last "data: [DONE]". Fails the test on bad framing.
std::vector<json> events_of(const std::string& body) {
  std::vector<json> out;
  std::size_t at = 0;
  bool done = false;
  while (at < body.size()) {
    const std::size_t end = body.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "an event without its blank line: " << body.substr(at);
    if (end == std::string::npos) break;
    const std::string event = body.substr(at, end - at);
    at = end + 2;
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    EXPECT_FALSE(done) << "an event after [DONE]: " << event;
    if (event == "data: [DONE]") {
      done = true;
      continue;
    }
    json j = json::parse(event.substr(6), nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << event;
    out.push_back(std::move(j));
  }
  EXPECT_TRUE(done) << "no data: [DONE] at the end";
  return out;
}

// A streamed completion's text and finish reason (every event's id the same).
std::pair<std::string, std::string> text_of(const std::vector<json>& events) {
  std::string text, finish;
  for (const json& e : events) {
    EXPECT_EQ(e["id"], events.front()["id"]);
    for (const json& c : e["choices"]) {
      EXPECT_TRUE(finish.empty()) << "an event after the finish_reason";
      text += c.contains("delta") ? c["delta"].value("content", "") : c["text"].get<std::string>();
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
  }
  return {text, finish};
}

// The value of the metric line `name` (with its labels) in /metrics; -1 when absent.
double metric(const Server& s, const std::string& name) {
  httplib::Client c = s.client();
  auto r = c.Get("/metrics");
  if (!r) return -1;
  std::istringstream in(r->body);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return -1;
}

// The metric once it reads `want`, or its value after `seconds`: a sequence's last token reaches
// its client before the engine's next step frees its pages, so a gauge read right after the
// last response may still count them.
double settled_metric(const Server& s, const std::string& name, double want, int seconds = 10) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  double value = metric(s, name);
  while (value != want && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    value = metric(s, name);
  }
  return value;
}

// A raw connection that sends `body` to `path` and reads until `bytes` have come back.
class RawStream {
 public:
  RawStream(int port, const std::string& path, const json& body) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    const std::string b = body.dump();
    const std::string req = "POST " + path +
                            " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                            "Content-Length: " +
                            std::to_string(b.size()) + "\r\n\r\n" + b;
    EXPECT_EQ(::send(fd_, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  }
  ~RawStream() { close(); }
  // Reads until `needle` has come (true) or the connection ends (false).
  bool read_until(const std::string& needle) {
    char buf[4096];
    while (got_.find(needle) == std::string::npos) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return false;
      got_.append(buf, static_cast<std::size_t>(n));
    }
    return true;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  const std::string& got() const { return got_; }

 private:
  int fd_ = -1;
  std::string got_;
};

json request(const std::string& prompt, int64_t max_tokens) {
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
}

TEST_F(ServeGenerate, ConcurrentStreamsEachGiveTheTextOfTheRequestAlone) {
  // Small steps: a long prompt is prefilled in chunks while the others decode.
  Server s({"--model", model(), "--max-num-seqs", "4", "--max-num-batched-tokens", "24"});
  ASSERT_GT(s.port(), 0) << s.log();
  std::vector<json> requests;
  for (int i = 0; i < 6; ++i) {
    std::string prompt = "Request " + std::to_string(i) + ": ";
    if (i == 2) prompt += std::string(100, 'x');  // five chunks of prefill
    requests.push_back(request(prompt, 24 + 8 * i));
  }
  requests.push_back({{"messages", {{{"role", "user"}, {"content", "hi there"}}}},
                      {"max_tokens", 30},
                      {"temperature", 0}});
  std::vector<std::string> alone;
  for (const json& r : requests) {
    const bool chat = r.contains("messages");
    auto res = post(s, chat ? "/v1/chat/completions" : "/v1/completions", r);
    ASSERT_TRUE(res && res->status == 200) << (res ? res->body : s.log());
    const json j = json::parse(res->body);
    EXPECT_EQ(j["object"], chat ? "chat.completion" : "text_completion");
    const json& choice = j["choices"][0];
    alone.push_back(chat ? choice["message"]["content"].get<std::string>()
                         : choice["text"].get<std::string>());
    if (!chat) {
      EXPECT_EQ(choice["finish_reason"], "length");
      EXPECT_EQ(j["usage"]["completion_tokens"], r["max_tokens"]);
    }
    EXPECT_EQ(j["usage"]["total_tokens"].get<int64_t>(),
              j["usage"]["prompt_tokens"].get<int64_t>() +
                  j["usage"]["completion_tokens"].get<int64_t>());
  }
  EXPECT_EQ(alone[0].size(), 24u) << "one ASCII character per token";
  // All at once, streamed (twice over: more streams than --max-num-seqs, so some wait).
  std::vector<std::string> bodies(2 * requests.size());
  std::vector<std::thread> clients;
  for (std::size_t i = 0; i < bodies.size(); ++i) {
    clients.emplace_back([&, i] {
      json r = requests[i % requests.size()];
      r["stream"] = true;
      r["stream_options"] = {{"include_usage", true}};
      auto res = post(s, r.contains("messages") ? "/v1/chat/completions" : "/v1/completions", r);
      if (res && res->status == 200) bodies[i] = res->body;
    });
  }
  for (auto& t : clients) t.join();
  for (std::size_t i = 0; i < bodies.size(); ++i) {
    SCOPED_TRACE("stream " + std::to_string(i));
    std::vector<json> events = events_of(bodies[i]);
    ASSERT_GE(events.size(), 2u) << bodies[i];
    const json usage = events.back();  // include_usage: a last event without choices
    EXPECT_TRUE(usage["choices"].empty());
    events.pop_back();
    const auto [text, finish] = text_of(events);
    EXPECT_EQ(text, alone[i % requests.size()]);
    EXPECT_FALSE(finish.empty());
    EXPECT_GT(usage["usage"]["completion_tokens"].get<int64_t>(), 0);
  }
  // On a mesh (rank 0 serves and broadcasts each step's batch): the same texts, streamed
  // concurrently. Tensor parallel over two ranks; then DP2 x TP2 over four, the requests spread
  // over two data-parallel groups, each decoding its own on its tensor-parallel pair, rank 0
  // streaming every group's tokens.
  auto texts_on = [&](const Server& server) {
    std::vector<std::string> bodies(requests.size());
    std::vector<std::thread> clients;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      clients.emplace_back([&, i] {
        json r = requests[i];
        r["stream"] = true;
        auto res =
            post(server, r.contains("messages") ? "/v1/chat/completions" : "/v1/completions", r);
        if (res && res->status == 200) bodies[i] = res->body;
      });
    }
    for (auto& t : clients) t.join();
    std::vector<std::string> texts;
    for (const std::string& body : bodies) texts.push_back(text_of(events_of(body)).first);
    return texts;
  };
  Server tp({"--model", model(), "--nproc", "2", "--max-num-seqs", "4", "--max-num-batched-tokens",
             "24"});
  ASSERT_GT(tp.port(), 0) << tp.log();
  EXPECT_EQ(texts_on(tp), alone) << "TP2";
  EXPECT_EQ(tp.stop(), 0) << tp.log();
  Server dp({"--model", model(), "--nproc", "4", "--mesh", "data=2,model=2", "--max-num-seqs", "4",
             "--max-num-batched-tokens", "24"});
  ASSERT_GT(dp.port(), 0) << dp.log();
  EXPECT_EQ(texts_on(dp), alone) << "DP2 x TP2";
  EXPECT_EQ(settled_metric(dp, "te_serve_kv_cache_blocks_used", 0), 0);
  EXPECT_EQ(dp.stop(), 0) << dp.log();
  EXPECT_EQ(settled_metric(s, "te_serve_kv_cache_blocks_used", 0), 0);
  EXPECT_EQ(settled_metric(s, "te_serve_running_sequences", 0), 0);
  EXPECT_GT(metric(s, "te_serve_time_to_first_token_seconds_count"), 0);
  EXPECT_GT(metric(s, "te_serve_inter_token_latency_seconds_count"), 0);
  EXPECT_EQ(metric(s, "te_serve_e2e_request_latency_seconds_count"),
            static_cast<double>(requests.size() + bodies.size()));
  EXPECT_EQ(s.stop(), 0) << s.log();
}

// A mixture of experts served expert parallel (--nproc 2, ep on the tensor-parallel axis: each
// rank half the experts, the heads split too) gives one process's greedy texts, requests at once.
TEST_F(ServeGenerate, AMixtureOfExpertsServedExpertParallelIsOneProcess) {
  const std::string moe = (dir_->path() / "tiny-moe").string();
  std::vector<json> requests;
  for (int i = 0; i < 4; ++i) requests.push_back(request("Expert " + std::to_string(i), 20));
  auto texts_on = [&](const Server& server) {
    std::vector<std::string> texts(requests.size());
    std::vector<std::thread> clients;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      clients.emplace_back([&, i] {
        auto res = post(server, "/v1/completions", requests[i]);
        if (res && res->status == 200) {
          texts[i] = json::parse(res->body)["choices"][0]["text"].get<std::string>();
        }
      });
    }
    for (auto& t : clients) t.join();
    return texts;
  };
  Server one({"--model", moe, "--max-num-seqs", "4"});
  ASSERT_GT(one.port(), 0) << one.log();
  const std::vector<std::string> alone = texts_on(one);
  EXPECT_EQ(alone[0].size(), 20u) << one.log();
  EXPECT_EQ(one.stop(), 0) << one.log();
  Server ep({"--model", moe, "--nproc", "2", "--mesh-resource", "tp=model,ep=model",
             "--max-num-seqs", "4"});
  ASSERT_GT(ep.port(), 0) << ep.log();
  EXPECT_EQ(texts_on(ep), alone) << "EP2 (ep on the tp axis)";
  EXPECT_EQ(ep.stop(), 0) << ep.log();
}

// Sends `r`, goes away once its sequence holds KV pages (a stream: once its first event has come),
// and expects the pages freed and the request counted as cancelled.
void leave_mid_request(const Server& s, const json& r) {
  {
    RawStream client(s.port(), "/v1/completions", r);
    if (r.value("stream", false)) ASSERT_TRUE(client.read_until("data: {")) << client.got();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (metric(s, "te_serve_kv_cache_blocks_used") <= 0 &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_GT(metric(s, "te_serve_kv_cache_blocks_used"), 0);
  }  // the client goes away with ~1900 tokens to go
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (metric(s, "te_serve_kv_cache_blocks_used") != 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(metric(s, "te_serve_kv_cache_blocks_used"), 0);
  EXPECT_EQ(metric(s, "te_serve_generation_requests_total{finish_reason=\"cancelled\"}"), 1);
  EXPECT_EQ(metric(s, "te_serve_generation_requests_total{finish_reason=\"length\"}"), -1)
      << "it was cancelled, not run to its end";
}

TEST_F(ServeGenerate, ADisconnectedStreamIsCancelledAndItsPagesFreedAtOnce) {
  Server s({"--model", model()});
  ASSERT_GT(s.port(), 0) << s.log();
  json r = request("Tell me everything.", kContext - 100);
  r["stream"] = true;
  leave_mid_request(s, r);
  // The server goes on serving.
  auto res = post(s, "/v1/completions", request("Still there?", 4));
  ASSERT_TRUE(res && res->status == 200);
  EXPECT_EQ(s.stop(), 0) << s.log();
}

// A non-streaming request holds no thread either, and its client going is noticed the same way.
TEST_F(ServeGenerate, AClientThatGoesBeforeAWholeAnswerHasItsRequestCancelled) {
  Server s({"--model", model()});
  ASSERT_GT(s.port(), 0) << s.log();
  leave_mid_request(s, request("Tell me everything.", kContext - 100));
  EXPECT_EQ(s.stop(), 0) << s.log();
}

// The measure for streams: with 200 slowloris clients and 500 idle keep-alive
// connections open, a new stream's first token arrives within 1 s of the unloaded figure; the
// crowd is shed at its deadlines.
TEST_F(ServeGenerate, SlowAndIdleClientsDelayNoStreamsFirstToken) {
  using Clock = std::chrono::steady_clock;
  Server s({"--model", model(), "--header-timeout", "8", "--keep-alive-timeout", "12"});
  ASSERT_GT(s.port(), 0) << s.log();
  json r = request("First words", 8);
  r["stream"] = true;
  auto first_token_seconds = [&] {
    const auto start = Clock::now();
    RawStream stream(s.port(), "/v1/completions", r);
    EXPECT_TRUE(stream.read_until("data: {")) << stream.got();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    EXPECT_TRUE(stream.read_until("data: [DONE]")) << stream.got();
    return seconds;
  };
  te::test::Crowded c = te::test::measure_beside_crowd(s.port(), 200, 500, first_token_seconds);
  te::test::Crowd& crowd = *c.crowd;
  const auto crowded = c.opened;
  ASSERT_EQ(crowd.slow().size(), 200u);
  ASSERT_EQ(crowd.idle_answered(), 500);
  EXPECT_LT(c.loaded, c.unloaded + 1.0) << "unloaded " << c.unloaded << " s";
  EXPECT_GE(metric(s, "te_serve_connections_open"), 700);
  EXPECT_LT(Clock::now() - crowded, std::chrono::seconds(7));  // all of them open meanwhile
  crowd.stop_trickling();
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (metric(s, "te_serve_connections_open") > 1 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(metric(s, "te_serve_connection_timeouts_total{phase=\"header\"}"), 200);
  EXPECT_EQ(metric(s, "te_serve_connection_timeouts_total{phase=\"keep_alive\"}"), 500);
  EXPECT_EQ(s.stop(), 0) << s.log();
}

TEST_F(ServeGenerate, AFullQueueIsAnswered503WithRetryAfter) {
  Server s({"--model", model(), "--max-num-seqs", "1", "--max-queue", "1"});
  ASSERT_GT(s.port(), 0) << s.log();
  json r = request("Long one.", kContext - 100);
  r["stream"] = true;
  // A fast build runs the long stream to its end in about a second; should it end before the
  // queue is seen full, try again (the race the test cannot close without a slower model).
  bool seen = false;
  for (int attempt = 0; attempt < 5 && !seen; ++attempt) {
    RawStream running(s.port(), "/v1/completions", r);
    ASSERT_TRUE(running.read_until("data: {"));
    RawStream waiting(s.port(), "/v1/completions", r);  // waits for the running one's slot
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (metric(s, "te_serve_waiting_sequences") != 1 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (metric(s, "te_serve_waiting_sequences") != 1) continue;  // the first one has ended
    auto full = post(s, "/v1/completions", request("One more.", 4));
    ASSERT_TRUE(full);
    if (full->status == 200) continue;  // the first one ended just before
    expect_openai_error(full, 503, "", "requests are waiting");
    EXPECT_EQ(full->get_header_value("Retry-After"), "1");
    seen = true;
  }
  EXPECT_TRUE(seen) << "the queue was never seen full: the running stream always ended first";
  EXPECT_EQ(s.stop(), 0) << s.log();
}

TEST_F(ServeGenerate, BadRequestsAre400NamingTheFieldAndDisturbNothing) {
  Server s({"--model", model(), "--max-sequence-length", "64"});
  ASSERT_GT(s.port(), 0) << s.log();
  httplib::Client c = s.client();
  expect_openai_error(c.Post("/v1/completions", "{\"prompt\": ", "application/json"), 400, "",
                      "not JSON");
  expect_openai_error(post(s, "/v1/completions", {{"max_tokens", 4}}), 400, "prompt", "missing");
  expect_openai_error(post(s, "/v1/completions", {{"prompt", "a"}, {"temperature", "hot"}}), 400,
                      "temperature", "send a number");
  expect_openai_error(post(s, "/v1/completions", {{"prompt", "a"}, {"temperature", 3}}), 400,
                      "temperature", "[0, 2]");
  expect_openai_error(post(s, "/v1/completions", {{"prompt", "a"}, {"presence_penalty", 2.5}}), 400,
                      "presence_penalty", "[-2, 2]");
  expect_openai_error(post(s, "/v1/completions", {{"prompt", "a"}, {"frequency_penalty", "x"}}),
                      400, "frequency_penalty", "send a number");
  expect_openai_error(post(s, "/v1/completions", {{"prompt", "a"}, {"max_tokens", 64}}), 400,
                      "max_tokens", "leave 63 of this server's context of 64");
  expect_openai_error(post(s, "/v1/completions", {{"prompt", std::string(80, 'a')}}), 400, "prompt",
                      "the prompt is 80 tokens");
  expect_openai_error(post(s, "/v1/completions", {{"prompt", "a"}, {"n", 2}}), 400, "n",
                      "one choice");
  expect_openai_error(post(s, "/v1/completions", {{"prompt", "a"}, {"max_tokens", 0}}), 400,
                      "max_tokens", "[1, ");
  expect_openai_error(post(s, "/v1/completions", {{"prompt", "a"}, {"min_tokens", 5}}), 400,
                      "min_tokens", "does not support");
  expect_openai_error(post(s, "/v1/chat/completions",
                           {{"messages", {{{"role", "user"}, {"content", "x"}}}},
                            {"max_tokens", 4},
                            {"max_completion_tokens", 5}}),
                      400, "max_completion_tokens", "send one of them");
  expect_openai_error(
      post(s, "/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"max_completion_tokens", 64}}),
      400, "max_completion_tokens", "\"max_completion_tokens\" is 64");
  expect_openai_error(post(s, "/v1/completions", {{"prompt", "a"}, {"logprobs", 6}}), 400,
                      "logprobs", "[0, 5]");
  expect_openai_error(post(s, "/v1/completions", {{"prompt", {1, 96}}}), 400, "prompt",
                      "outside the vocabulary of 96");
  expect_openai_error(post(s, "/v1/completions", {{"prompt", "a"}, {"echo", true}}), 400, "echo",
                      "does not support");
  expect_openai_error(
      post(s, "/v1/completions", {{"prompt", "a"}, {"stream_options", json::object()}}), 400,
      "stream_options", "only allowed with \"stream\": true");
  expect_openai_error(
      post(s, "/v1/chat/completions", {{"messages", {{{"role", "tool"}, {"content", "x"}}}}}), 400,
      "messages[0].role", "\"tool\"");
  expect_openai_error(post(s, "/v1/chat/completions", {{"messages", json::array()}}), 400,
                      "messages", "non-empty");
  expect_openai_error(c.Post("/v1/nothing", "{}", "application/json"), 404, "",
                      "POST /v1/completions");
  // Unknown fields are ignored, as OpenAI's API does; the server serves on.
  auto ok = post(s, "/v1/completions",
                 {{"prompt", "ok"}, {"max_tokens", 3}, {"ignore_eos", true}, {"no_such", 1}});
  ASSERT_TRUE(ok && ok->status == 200) << (ok ? ok->body : "");
  EXPECT_EQ(json::parse(ok->body)["usage"]["completion_tokens"], 3);
  EXPECT_EQ(s.stop(), 0) << s.log();
}

TEST_F(ServeGenerate, AServerThatCannotServeSaysWhyAtStartAndExits2) {
  auto [code, out] =
      te::test::run(std::string(TE_SERVE_PATH) + " --port 0 --model " + model() + " --nproc 3");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("4 query heads and 2 key/value heads"), std::string::npos) << out;
  std::tie(code, out) = te::test::run(std::string(TE_SERVE_PATH) + " --port 0 --model " + model() +
                                      " --max-num-seqs 8 --max-num-batched-tokens 4");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--max-num-batched-tokens 4 is below --max-num-seqs 8"), std::string::npos)
      << out;
  std::tie(code, out) =
      te::test::run(std::string(TE_SERVE_PATH) + " --port 0 --load ckpt --max-num-seqs 8");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--max-num-seqs is for a decoder model"), std::string::npos) << out;
}

TEST_F(ServeGenerate, LogprobsAndSeedsAreTheRequestsOwn) {
  Server s({"--model", model()});
  ASSERT_GT(s.port(), 0) << s.log();
  json r = request("Greedy", 6);
  r["logprobs"] = 3;
  auto res = post(s, "/v1/completions", r);
  ASSERT_TRUE(res && res->status == 200) << (res ? res->body : "");
  const json l = json::parse(res->body)["choices"][0]["logprobs"];
  ASSERT_EQ(l["tokens"].size(), 6u);
  std::string joined;
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(l["text_offset"][i], joined.size());
    joined += l["tokens"][i].get<std::string>();
    ASSERT_EQ(l["top_logprobs"][i].size(), 3u);
    double best = -1e9;
    for (const auto& [t, lp] : l["top_logprobs"][i].items())
      best = std::max(best, lp.get<double>());
    EXPECT_NEAR(l["token_logprobs"][i].get<double>(), best, 1e-5) << "greedy takes the top token";
  }
  // The text leaves out special tokens (here <|endoftext|>, drawn past the eos by ignore_eos).
  for (std::size_t at; (at = joined.find("<|endoftext|>")) != std::string::npos;) {
    joined.erase(at, 13);
  }
  EXPECT_EQ(joined, json::parse(res->body)["choices"][0]["text"]);
  // Chat's logprobs: content entries with bytes.
  auto chat = post(s, "/v1/chat/completions",
                   {{"messages", {{{"role", "user"}, {"content", "x"}}}},
                    {"max_tokens", 2},
                    {"logprobs", true},
                    {"top_logprobs", 2}});
  ASSERT_TRUE(chat && chat->status == 200) << (chat ? chat->body : "");
  const json content = json::parse(chat->body)["choices"][0]["logprobs"]["content"];
  ASSERT_FALSE(content.empty());
  EXPECT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_FALSE(content[0]["bytes"].empty());
  // Sampling with a seed: the same text each time; another seed, another text.
  json sampled = {{"prompt", "Dice"},
                  {"max_tokens", 24},
                  {"temperature", 1.5},
                  {"seed", 7},
                  {"ignore_eos", true}};
  auto text = [&](const json& body) {
    auto x = post(s, "/v1/completions", body);
    return x && x->status == 200 ? json::parse(x->body)["choices"][0]["text"].get<std::string>()
                                 : std::string("(failed)");
  };
  const std::string first = text(sampled);
  EXPECT_EQ(text(sampled), first);
  sampled["seed"] = 8;
  EXPECT_NE(text(sampled), first);
  EXPECT_EQ(s.stop(), 0) << s.log();
}

TEST_F(ServeGenerate, StopStringsEndTheTextBeforeThemAndChatStreamsAsOpenAiDoes) {
  Server s({"--model", model()});
  ASSERT_GT(s.port(), 0) << s.log();
  auto whole = post(s, "/v1/completions", request("Stop here", 40));
  ASSERT_TRUE(whole && whole->status == 200);
  const std::string text = json::parse(whole->body)["choices"][0]["text"];
  ASSERT_GE(text.size(), 20u);
  const std::string stop = text.substr(10, 3);  // three characters from the middle
  json r = request("Stop here", 40);
  r["stop"] = {stop, "\u00e9\u00e9"};  // the second never comes (ASCII text)
  for (const bool stream : {false, true}) {
    r["stream"] = stream;
    auto res = post(s, "/v1/completions", r);
    ASSERT_TRUE(res && res->status == 200) << (res ? res->body : "");
    const auto [got, finish] = stream ? text_of(events_of(res->body))
                                      : std::pair<std::string, std::string>{
                                            json::parse(res->body)["choices"][0]["text"],
                                            json::parse(res->body)["choices"][0]["finish_reason"]};
    EXPECT_EQ(got, text.substr(0, text.find(stop))) << (stream ? "stream" : "whole");
    EXPECT_EQ(finish, "stop");
  }
  // Chat streams: the first delta carries the role; with include_usage every event has "usage"
  // (null until the last, which has no choices); the model is the one that answered.
  auto chat = post(s, "/v1/chat/completions",
                   {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                    {"model", "gpt-4"},
                    {"max_tokens", 5},
                    {"ignore_eos", true},
                    {"stream", true},
                    {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(chat && chat->status == 200);
  const std::vector<json> events = events_of(chat->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_TRUE(events[i].contains("usage") && events[i]["usage"].is_null()) << events[i];
    EXPECT_EQ(events[i]["object"], "chat.completion.chunk");
    EXPECT_EQ(events[i]["model"], "tiny-llama");
  }
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 5);
  EXPECT_EQ(s.stop(), 0) << s.log();
}

// What OpenAI clients call first and read last: the model list and each model under every
// --served-model-name, /health, a request for another model answered 404 model_not_found, the
// finish_reason in a last event of its own with an empty delta, system_fingerprint and
// usage.prompt_tokens_details in every response, a context overflow's code.
TEST_F(ServeGenerate, ModelsHealthAndTheFieldsClientsReadAreOpenAis) {
  Server s({"--model", model(), "--served-model-name", "tiny", "org/tiny-alias",
            "--max-sequence-length", "64"});
  ASSERT_GT(s.port(), 0) << s.log();
  httplib::Client c = s.client();
  auto list = c.Get("/v1/models");
  ASSERT_TRUE(list && list->status == 200);
  const json models = json::parse(list->body);
  EXPECT_EQ(models["object"], "list");
  ASSERT_EQ(models["data"].size(), 2u) << list->body;
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][1]["id"], "org/tiny-alias");
  for (const json& m : models["data"]) {
    EXPECT_EQ(m["object"], "model");
    EXPECT_EQ(m["owned_by"], "te-cpp");
    EXPECT_GT(m["created"].get<int64_t>(), 1700000000);
  }
  for (const char* path :
       {"/v1/models/tiny", "/v1/models/org/tiny-alias", "/v1/models/org%2Ftiny-alias"}) {
    auto one = c.Get(path);
    ASSERT_TRUE(one && one->status == 200) << path;
    EXPECT_EQ(json::parse(one->body)["object"], "model") << path;
  }
  expect_openai_error(c.Get("/v1/models/gpt-4"), 404, "model", "the model 'gpt-4' does not exist");
  auto health = c.Get("/health");
  ASSERT_TRUE(health && health->status == 200);
  EXPECT_EQ(json::parse(health->body)["status"], "ok");
  // Another model is refused (OpenAI's and vLLM's 404 model_not_found); an alias answers, and
  // every response names the first.
  auto other = post(s, "/v1/completions", {{"prompt", "a"}, {"model", "gpt-4"}});
  expect_openai_error(other, 404, "model", "this server serves 'tiny', 'org/tiny-alias'");
  EXPECT_EQ(json::parse(other->body)["error"]["code"], "model_not_found");
  EXPECT_EQ(json::parse(other->body)["error"]["type"], "invalid_request_error");
  auto whole = post(s, "/v1/completions",
                    {{"prompt", "Hi"}, {"model", "org/tiny-alias"}, {"max_tokens", 3}});
  ASSERT_TRUE(whole && whole->status == 200) << (whole ? whole->body : "");
  const json w = json::parse(whole->body);
  EXPECT_EQ(w["model"], "tiny");
  EXPECT_EQ(w["system_fingerprint"].get<std::string>().rfind("te-cpp-", 0), 0u) << w;
  EXPECT_EQ(w["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  // A stream's last token comes before its finish_reason, which has an event of its own with an
  // empty delta (chat) or text (completions).
  for (const bool chat : {true, false}) {
    json r = {{"max_tokens", 4}, {"ignore_eos", true}, {"temperature", 0}};
    if (chat) {
      r["messages"] = {{{"role", "user"}, {"content", "hi"}}};
    } else {
      r["prompt"] = "Hi";
    }
    const char* path = chat ? "/v1/chat/completions" : "/v1/completions";
    auto one = post(s, path, r);  // the same greedy text, whole
    ASSERT_TRUE(one && one->status == 200);
    const json answer = json::parse(one->body)["choices"][0];
    const std::string want = chat ? answer["message"]["content"] : answer["text"];
    r["stream"] = true;
    auto res = post(s, path, r);
    ASSERT_TRUE(res && res->status == 200);
    const std::vector<json> events = events_of(res->body);
    ASSERT_GE(events.size(), 2u);
    const json& last = events.back()["choices"][0];
    EXPECT_EQ(last["finish_reason"], "length") << events.back();
    if (chat) {
      EXPECT_EQ(last["delta"], json::object()) << events.back();
    } else {
      EXPECT_EQ(last["text"], "") << events.back();
    }
    EXPECT_TRUE(events[events.size() - 2]["choices"][0]["finish_reason"].is_null());
    EXPECT_EQ(text_of(events).first, want) << res->body;
    for (const json& e : events) EXPECT_EQ(e["system_fingerprint"], w["system_fingerprint"]);
  }
  // A prompt the context cannot hold: OpenAI's context_length_exceeded.
  auto long_prompt = post(s, "/v1/completions", {{"prompt", std::string(80, 'a')}});
  expect_openai_error(long_prompt, 400, "prompt", "the prompt is 80 tokens");
  EXPECT_EQ(json::parse(long_prompt->body)["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(s.stop(), 0) << s.log();
}

TEST_F(ServeGenerate, SigtermFinishesRunningStreamsRefusesNewOnesAndExits0) {
  Server s({"--model", model(), "--drain-timeout", "60"});
  ASSERT_GT(s.port(), 0) << s.log();
  json r = request("Before the end", 400);
  r["stream"] = true;
  RawStream stream(s.port(), "/v1/completions", r);
  ASSERT_TRUE(stream.read_until("data: {"));
  std::thread stopper([&] { EXPECT_EQ(s.stop(SIGTERM), 0); });
  // Draining: a new request is refused (the stream has ~380 tokens to go, seconds).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto late = post(s, "/v1/completions", request("Too late", 1));
  while (late && late->status == 200 && std::chrono::steady_clock::now() < until) {
    late = post(s, "/v1/completions", request("Too late", 1));
  }
  expect_openai_error(late, 503, "", "shutting down");
  EXPECT_TRUE(stream.read_until("data: [DONE]")) << stream.got();
  stopper.join();
  EXPECT_NE(stream.got().find("\"finish_reason\":\"length\""), std::string::npos);
  EXPECT_NE(s.log().find("SIGTERM: draining"), std::string::npos) << s.log();
}

}  // namespace
