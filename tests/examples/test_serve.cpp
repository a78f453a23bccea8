// te-serve as a client sees it: a real server process on a free loopback port, serving a small
// checkpoint te-encoder trains here; every good and bad request with its status and body, the
// queue limit, metrics, FP8 weights, bad checkpoints at start, and SIGTERM draining in-flight
// requests.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../temp_dir.h"
#include "server_process.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using te::test::expect_error;
using te::test::run;
using te::test::Server;
using te::test::shell_quoted;

std::string sentences_body(const std::vector<std::string>& sentences) {
  return json{{"sentences", sentences}}.dump();
}

class Serve : public ::testing::Test {
 protected:
  // One small checkpoint for the suite: a short te-encoder training.
  static void SetUpTestSuite() {
    dir_ = new te::test::TempDir("te_serve");
    checkpoint_ = (dir_->path() / "ckpt").string();
    const auto [code, out] =
        run(std::string(TE_ENCODER_PATH) + " --data " + shell_quoted(TE_ENCODER_DATA) +
            " --max-steps 10 --batch-size 32 --hidden-size 32 --mlp-hidden-size 64 --heads 4 "
            "--max-seq-len 16 --save " +
            shell_quoted(checkpoint_));
    ASSERT_EQ(code, 0) << out;
  }
  static void TearDownTestSuite() { delete dir_; }

  static te::test::TempDir* dir_;
  static std::string checkpoint_;
};
te::test::TempDir* Serve::dir_ = nullptr;
std::string Serve::checkpoint_;

TEST_F(Serve, AnswersGoodRequestsAndRefusesBadOnesWithTheirStatus) {
  Server server({"--load", checkpoint_, "--max-batch", "4", "--max-body-bytes", "4096"});
  ASSERT_GT(server.port(), 0) << server.log();
  auto c = server.client();

  auto ok = c.Post("/v1/classify", sentences_body({"The cat sat on the mat.", "Mat the on sat."}),
                   "application/json");
  ASSERT_TRUE(ok);
  ASSERT_EQ(ok->status, 200) << ok->body;
  const json answer = json::parse(ok->body);
  ASSERT_EQ(answer["labels"].size(), 2u);
  ASSERT_EQ(answer["probabilities"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const double p0 = answer["probabilities"][i][0], p1 = answer["probabilities"][i][1];
    EXPECT_NEAR(p0 + p1, 1.0, 1e-6);
    EXPECT_EQ(answer["labels"][i].get<int>(), p1 > p0 ? 1 : 0);
  }
  EXPECT_EQ(answer["truncated"], json({false, false}));

  // Over-long sentences are read up to max_seq_len (16 words here) and flagged.
  std::string long_sentence;
  for (int i = 0; i < 40; ++i) long_sentence += "word ";
  auto truncated =
      c.Post("/v1/classify", sentences_body({"Short one.", long_sentence}), "application/json");
  ASSERT_TRUE(truncated);
  EXPECT_EQ(truncated->status, 200);
  EXPECT_EQ(json::parse(truncated->body)["truncated"], json({false, true}));

  expect_error(c.Post("/v1/classify", "{\"sentences\": [", "application/json"), 400, "not JSON");
  // A number no double holds (found by fuzz/fuzz_request; it was a 500).
  expect_error(c.Post("/v1/classify", "{\"sentences\": [1e999]}", "application/json"), 400,
               "number overflow");
  expect_error(c.Post("/v1/classify", "[1, 2]", "application/json"), 400, "JSON array");
  expect_error(c.Post("/v1/classify", "{\"text\": [\"a\"]}", "application/json"), 400,
               "no \"sentences\"");
  expect_error(c.Post("/v1/classify", "{\"sentences\": \"a b\"}", "application/json"), 400,
               "\"sentences\" is a JSON string");
  expect_error(c.Post("/v1/classify", "{\"sentences\": [\"ok\", 7]}", "application/json"), 400,
               "sentences[1] is a JSON number");
  expect_error(c.Post("/v1/classify", "{\"sentences\": []}", "application/json"), 400,
               "\"sentences\" is empty");
  expect_error(c.Post("/v1/classify", "{\"sentences\": [\"  \"]}", "application/json"), 400,
               "sentences[0] has no words");
  expect_error(c.Post("/v1/classify", "{\"sentences\": [\"caf\xc3\"]}", "application/json"), 400,
               "not valid UTF-8");
  // 8 x max-batch sentences per request at most.
  expect_error(c.Post("/v1/classify", sentences_body(std::vector<std::string>(33, "A cat.")),
                      "application/json"),
               413, "at most 32 per request");
  expect_error(c.Post("/v1/classify", sentences_body({std::string(5000, 'a')}), "application/json"),
               413, "over 4096 bytes");
  expect_error(c.Get("/v2/classify"), 404, "no endpoint GET /v2/classify");

  // A request of more than max_batch sentences runs in several calls and is answered whole.
  std::vector<std::string> many;
  for (int i = 0; i < 30; ++i) many.push_back("Sentence number " + std::to_string(i) + ".");
  auto big = c.Post("/v1/classify", sentences_body(many), "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 200);
  EXPECT_EQ(json::parse(big->body)["labels"].size(), 30u);

  auto health = c.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["status"], "ok");

  // A request is counted once its response is written (httplib's logger), which may be just
  // after the client has read it: look again for a moment before calling a count wrong.
  const std::vector<std::string> lines = {
      "te_serve_requests_total{path=\"/v1/classify\",status=\"200\"} 3",
      "te_serve_requests_total{path=\"/v1/classify\",status=\"400\"} 9",
      "te_serve_requests_total{path=\"/v1/classify\",status=\"413\"} 2",
      "te_serve_requests_total{path=\"/v2/classify\",status=\"404\"} 1",
      "# TYPE te_serve_request_duration_seconds histogram",
      "te_serve_batch_size_count 10",
      "te_serve_batch_size_bucket{le=\"4\"} 10",
      "te_serve_queue_depth 0",
      "te_serve_model_seconds_total ",
      "te_serve_resident_bytes ",
      "te_serve_weight_bytes "};
  std::string body;
  for (int attempt = 0; attempt < 100; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto metrics = c.Get("/metrics");
    ASSERT_TRUE(metrics);
    EXPECT_EQ(metrics->status, 200);
    body = metrics->body;
    if (std::all_of(lines.begin(), lines.end(),
                    [&](const std::string& l) { return body.find(l) != std::string::npos; })) {
      break;
    }
  }
  for (const std::string& line : lines) {
    EXPECT_NE(body.find(line), std::string::npos) << "missing: " << line << "\n" << body;
  }
  EXPECT_EQ(server.stop(SIGTERM), 0) << server.log();
}

TEST_F(Serve, ConcurrentRequestsAreBatchedAndEachGetsItsOwnRows) {
  Server server({"--load", checkpoint_, "--max-batch", "16", "--max-wait-ms", "20"});
  ASSERT_GT(server.port(), 0) << server.log();
  // Each sentence alone, one request at a time: the reference.
  std::vector<std::string> sentences;
  for (int i = 0; i < 24; ++i) {
    sentences.push_back(i % 2 ? "The book was read by " + std::to_string(i) + " students."
                              : "Read book the students " + std::to_string(i));
  }
  std::vector<json> alone(sentences.size());
  {
    auto c = server.client();
    for (std::size_t i = 0; i < sentences.size(); ++i) {
      auto r = c.Post("/v1/classify", sentences_body({sentences[i]}), "application/json");
      ASSERT_TRUE(r && r->status == 200);
      alone[i] = json::parse(r->body);
    }
  }
  std::vector<json> together(sentences.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < sentences.size(); ++i) {
    threads.emplace_back([&, i] {
      auto c = server.client();
      auto r = c.Post("/v1/classify", sentences_body({sentences[i]}), "application/json");
      if (r && r->status == 200) {
        together[i] = json::parse(r->body);
      } else {
        together[i] = r ? json(r->status) : json(httplib::to_string(r.error()));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (std::size_t i = 0; i < sentences.size(); ++i) {
    ASSERT_TRUE(together[i].is_object()) << "request " << i << " failed: " << together[i];
    EXPECT_EQ(together[i]["labels"], alone[i]["labels"]) << sentences[i];
    // The same rows in a bigger GEMM: equal up to the summation order of the BLAS.
    EXPECT_NEAR(together[i]["probabilities"][0][1].get<double>(),
                alone[i]["probabilities"][0][1].get<double>(), 1e-5);
  }
  auto metrics = server.client().Get("/metrics");
  ASSERT_TRUE(metrics);
  // 24 + 24 sentences in fewer than 24 + 24 model calls: some calls took several requests.
  const auto at = metrics->body.find("te_serve_batch_size_count ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_LT(std::stoi(metrics->body.substr(at + 26)), 48) << metrics->body;
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST_F(Serve, AFullQueueAnswers503WithRetryAfter) {
  Server server({"--load", checkpoint_, "--max-batch", "4", "--max-queue", "1", "--max-wait-ms",
                 "0", "--workers", "1"});
  ASSERT_GT(server.port(), 0) << server.log();
  std::vector<std::string> heavy(32, "A sentence that keeps the worker busy for a while.");
  std::atomic<int> ok{0}, full{0}, other{0};
  std::atomic<bool> retry_after{true};
  std::mutex mu;
  std::string others;
  std::vector<std::thread> threads;
  for (int i = 0; i < 24; ++i) {
    threads.emplace_back([&] {
      auto c = server.client();
      auto r = c.Post("/v1/classify", sentences_body(heavy), "application/json");
      if (r && r->status == 200) {
        ++ok;
      } else if (r && r->status == 503) {
        ++full;
        if (r->get_header_value("Retry-After") != "1" ||
            r->body.find("the queue is full") == std::string::npos) {
          retry_after = false;
        }
      } else {
        ++other;
        std::lock_guard<std::mutex> lock(mu);
        others +=
            (r ? std::to_string(r->status) + " " + r->body : httplib::to_string(r.error())) + "; ";
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_GT(full.load(), 0);
  EXPECT_GT(ok.load(), 0);
  EXPECT_EQ(other.load(), 0) << others;
  EXPECT_TRUE(retry_after.load());
  // The server still answers afterwards.
  auto r =
      server.client().Post("/v1/classify", sentences_body({"Still here."}), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST_F(Serve, SigtermAnswersInFlightRequestsThenExitsZero) {
  // A batch waits up to 10 s for company, and the signal comes once all 8 requests wait in it
  // (the queue-depth gauge says so), so every request is in flight at the signal however slow
  // the machine (a fixed 150 ms pause was not enough under TSan).
  Server server({"--load", checkpoint_, "--max-batch", "64", "--max-wait-ms", "10000"});
  ASSERT_GT(server.port(), 0) << server.log();
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      auto c = server.client();
      auto r = c.Post("/v1/classify", sentences_body({"Request " + std::to_string(i) + "."}),
                      "application/json");
      if (r && r->status == 200) ++ok;
    });
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(9);
  std::string metrics;
  while (metrics.find("te_serve_queue_depth 8\n") == std::string::npos &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto m = server.client().Get("/metrics");
    metrics = m ? m->body : std::string();
  }
  EXPECT_NE(metrics.find("te_serve_queue_depth 8\n"), std::string::npos) << metrics;
  const auto signalled = std::chrono::steady_clock::now();
  EXPECT_EQ(server.stop(SIGTERM), 0) << server.log();
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 8);
  // The signal closes the gathering batch: nobody waits out the 10 s.
  EXPECT_LT(std::chrono::steady_clock::now() - signalled, std::chrono::seconds(8));
  EXPECT_NE(server.log().find("draining in-flight requests"), std::string::npos) << server.log();
  // Nothing listens any more.
  httplib::Client after("127.0.0.1", server.port());
  after.set_connection_timeout(1, 0);
  EXPECT_FALSE(after.Get("/healthz"));
}

// The measure: with 200 slowloris clients (a header line a second, never done) and 500
// idle keep-alive connections open, a classify request on a new connection arrives within 1 s of
// the unloaded figure; the slow clients are then answered 408 at --header-timeout and the idle
// connections closed at --keep-alive-timeout, and the metrics count both.
TEST_F(Serve, SlowAndIdleClientsDelayNoRequestAndAreShedAtTheirDeadlines) {
  using Clock = std::chrono::steady_clock;
  // Deadlines long enough that the crowd is whole while a slow machine measures.
  Server server({"--load", checkpoint_, "--header-timeout", "8", "--keep-alive-timeout", "12"});
  ASSERT_GT(server.port(), 0) << server.log();
  const std::string body = sentences_body({"The cat sat on the mat."});
  auto classify_seconds = [&] {
    const auto start = Clock::now();
    auto c = server.client();  // a new connection, as a new client's
    auto r = c.Post("/v1/classify", body, "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : httplib::to_string(r.error()));
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  const te::test::Crowded c =
      te::test::measure_beside_crowd(server.port(), 200, 500, classify_seconds);
  const te::test::Crowd& crowd = *c.crowd;
  const auto crowded = c.opened;
  ASSERT_EQ(crowd.slow().size(), 200u);
  ASSERT_EQ(crowd.idle_answered(), 500);
  EXPECT_LT(c.loaded, c.unloaded + 1.0) << "unloaded " << c.unloaded << " s";
  auto metrics = server.client().Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_GE(te::test::metric_value(metrics->body, "te_serve_connections_open"), 700)
      << metrics->body;
  // The measure above ran while every crowd connection was open.
  EXPECT_LT(Clock::now() - crowded, std::chrono::seconds(7));

  for (int fd : crowd.slow()) {
    bool closed = false;
    const std::string answer = te::test::read_until_closed(fd, std::chrono::seconds(20), &closed);
    EXPECT_TRUE(closed);
    ASSERT_EQ(answer.rfind("HTTP/1.1 408", 0), 0u) << answer;
    EXPECT_NE(answer.find("--header-timeout"), std::string::npos) << answer;
  }
  EXPECT_GE(Clock::now() - crowded, std::chrono::seconds(7));  // not before their time
  for (int fd : crowd.idle()) {
    bool closed = false;
    EXPECT_EQ(te::test::read_until_closed(fd, std::chrono::seconds(20), &closed), "");
    EXPECT_TRUE(closed);
  }
  std::string text;
  for (int attempt = 0; attempt < 50; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    metrics = server.client().Get("/metrics");
    ASSERT_TRUE(metrics);
    text = metrics->body;
    if (te::test::metric_value(text, "te_serve_connections_open") <= 2) break;
  }
  EXPECT_EQ(te::test::metric_value(text, "te_serve_connection_timeouts_total{phase=\"header\"}"),
            200)
      << text;
  EXPECT_EQ(
      te::test::metric_value(text, "te_serve_connection_timeouts_total{phase=\"keep_alive\"}"), 500)
      << text;
  EXPECT_LE(te::test::metric_value(text, "te_serve_connections_open"), 2) << text;
  EXPECT_EQ(server.stop(SIGTERM), 0) << server.log();
}

// A connection beyond --max-connections is answered 503 naming the option, and served again once
// one closes; a body that does not come within --body-timeout is 408; oversized headers are 431;
// bytes that are not HTTP are 400, a path that is not UTF-8 404; a connection that sends nothing
// is closed at --header-timeout without an answer. None of them disturbs the server.
TEST_F(Serve, ConnectionsBeyondTheCapAndLateOrMalformedRequestsAreRefused) {
  Server server({"--load", checkpoint_, "--max-connections", "3", "--body-timeout", "1",
                 "--header-timeout", "1"});
  ASSERT_GT(server.port(), 0) << server.log();
  {
    te::test::Crowd crowd(server.port(), 0, 3);
    ASSERT_EQ(crowd.idle_answered(), 3);
    auto refused = server.client().Get("/healthz");
    expect_error(refused, 503, "(--max-connections)");
    EXPECT_EQ(refused->get_header_value("Retry-After"), "1");
  }
  // Served again once the crowd has gone (the server sees the closes a moment later).
  int status = 0;
  std::string answer;
  for (int attempt = 0; attempt < 50 && status != 200; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto again =
        server.client().Post("/v1/classify", sentences_body({"A cat."}), "application/json");
    status = again ? again->status : 0;
    answer = again ? again->body : httplib::to_string(again.error());
  }
  EXPECT_EQ(status, 200) << answer;

  auto raw = [&](const std::string& bytes) {
    const int fd = te::test::connect_to(server.port());
    EXPECT_GE(fd, 0);
    te::test::send_all(fd, bytes);
    bool closed = false;
    std::string answer = te::test::read_until_closed(fd, std::chrono::seconds(10), &closed);
    EXPECT_TRUE(closed) << answer;
    ::close(fd);
    return answer;
  };
  const std::string late =
      raw("POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"sen");
  EXPECT_EQ(late.rfind("HTTP/1.1 408", 0), 0u) << late;
  EXPECT_NE(late.find("--body-timeout"), std::string::npos) << late;
  const std::string big =
      raw("GET /healthz HTTP/1.1\r\nX-Big: " + std::string(70000, 'a') + "\r\n\r\n");
  EXPECT_EQ(big.rfind("HTTP/1.1 431", 0), 0u) << big;
  const std::string junk = raw("NOT HTTP AT ALL\r\n\r\n");
  EXPECT_EQ(junk.rfind("HTTP/1.1 400", 0), 0u) << junk;
  const std::string latin1 = raw("GET /caf\xe9 HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(latin1.rfind("HTTP/1.1 404", 0), 0u) << latin1;
  EXPECT_EQ(raw(""), "");  // nothing sent, nothing answered
  // HTTP/1.0: answered in 1.0 and closed.
  const std::string old = raw("GET /healthz HTTP/1.0\r\n\r\n");
  EXPECT_EQ(old.rfind("HTTP/1.0 200", 0), 0u) << old;
  // HEAD: GET's header, its Content-Length included, without the body; the connection goes on
  // (a GET pipelined behind it is answered next).
  const std::string head =
      raw("HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
          "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::size_t head_end = head.find("\r\n\r\n");
  ASSERT_NE(head_end, std::string::npos) << head;
  EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u) << head;
  EXPECT_EQ(head.compare(head_end + 4, 12, "HTTP/1.1 200"), 0) << head;
  const std::size_t get_end = head.find("\r\n\r\n", head_end + 4);
  ASSERT_NE(get_end, std::string::npos) << head;
  const std::size_t length_at = head.find("Content-Length: ");
  ASSERT_LT(length_at, head_end) << head;
  EXPECT_EQ(std::stoul(head.substr(length_at + 16)), head.size() - (get_end + 4)) << head;

  auto ok = server.client().Get("/healthz");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  auto metrics = server.client().Get("/metrics");
  ASSERT_TRUE(metrics);
  // The crowd's refused one, and any retry that came before the server saw the crowd go.
  EXPECT_GE(te::test::metric_value(metrics->body, "te_serve_connections_refused_total"), 1)
      << metrics->body;
  EXPECT_EQ(
      te::test::metric_value(metrics->body, "te_serve_connection_timeouts_total{phase=\"body\"}"),
      1)
      << metrics->body;
  EXPECT_EQ(server.stop(SIGTERM), 0) << server.log();
}

TEST_F(Serve, Fp8WeightsServeFromAQuarterOfTheBytes) {
  const std::string fp8_dir = (dir_->path() / "ckpt-fp8").string();
  const auto [code, out] = run(std::string(TE_SERVE_PATH) + " --load " + shell_quoted(checkpoint_) +
                               " --export-fp8 " + shell_quoted(fp8_dir));
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("(fp8)"), std::string::npos) << out;
  std::ifstream index(fs::path(fp8_dir) / "model.safetensors.index.json");
  const json tensors = json::parse(index)["te"]["tensors"];
  ASSERT_TRUE(tensors.contains("layer.mlp.wi_fp8_kernel"));
  EXPECT_EQ(tensors["layer.mlp.wi_fp8_kernel"]["dtype"], "U8");
  EXPECT_FALSE(tensors.contains("layer.mlp.wi_kernel"));
  EXPECT_EQ(tensors["embedding_fp8"]["dtype"], "U8");
  EXPECT_FALSE(tensors.contains("embedding"));

  const std::vector<std::string> sentences = {"The cat sat on the mat.", "Mat the on sat.",
                                              "John seems to be happy.", "John seems happy be."};
  auto classify = [&](const std::vector<std::string>& args) {
    Server server(args);
    EXPECT_GT(server.port(), 0) << server.log();
    auto r = server.client().Post("/v1/classify", sentences_body(sentences), "application/json");
    EXPECT_TRUE(r && r->status == 200);
    EXPECT_EQ(server.stop(SIGTERM), 0);
    return std::make_pair(json::parse(r ? r->body : "{}"), server.log());
  };
  const auto [fp32, fp32_log] = classify({"--load", checkpoint_});
  const auto [frozen, frozen_log] = classify({"--load", checkpoint_, "--fp8-weights"});
  const auto [exported, exported_log] = classify({"--load", fp8_dir});
  EXPECT_NE(frozen_log.find("(fp8)"), std::string::npos) << frozen_log;
  EXPECT_NE(exported_log.find("(fp8)"), std::string::npos) << exported_log;
  // Loading the exported codes gives exactly what freezing at load gives.
  EXPECT_EQ(exported["probabilities"], frozen["probabilities"]);
  for (std::size_t i = 0; i < sentences.size(); ++i) {
    // E4M3 GEMMs move the probabilities by a few percent at most on this small model.
    EXPECT_NEAR(frozen["probabilities"][i][1].get<double>(),
                fp32["probabilities"][i][1].get<double>(), 0.05);
    EXPECT_NE(frozen["probabilities"][i][1], fp32["probabilities"][i][1]);
  }
}

TEST_F(Serve, BadCheckpointsAndPortsStopTheStartWithOneLineAndExitCode2) {
  auto serve = [](const std::string& args) {
    return run(std::string(TE_SERVE_PATH) + " --port 0 " + args);
  };
  const fs::path root = dir_->path();
  auto expect_one_line = [](const std::pair<int, std::string>& r, const std::string& words) {
    EXPECT_EQ(r.first, 2) << r.second;
    EXPECT_NE(r.second.find("te-serve: error: "), std::string::npos) << r.second;
    EXPECT_NE(r.second.find(words), std::string::npos) << r.second;
    EXPECT_EQ(std::count(r.second.begin(), r.second.end(), '\n'), 1) << r.second;
  };
  expect_one_line(serve("--load " + shell_quoted((root / "missing").string())), "no checkpoint at");

  // A damaged index.
  fs::create_directories(root / "corrupt");
  fs::copy(checkpoint_, root / "corrupt",
           fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  std::ofstream(root / "corrupt" / "model.safetensors.index.json") << "{\"te\": {\"tens";
  expect_one_line(serve("--load " + shell_quoted((root / "corrupt").string())), "is not JSON");

  // Damaged data: a flipped byte deep in the file fails its checksum.
  fs::create_directories(root / "flipped");
  fs::copy(checkpoint_, root / "flipped",
           fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  {
    std::fstream f(root / "flipped" / "model.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-100, std::ios::end);
    f.put('\x5a');
  }
  expect_one_line(serve("--load " + shell_quoted((root / "flipped").string())), "CRC");

  // Another config: the index says hidden 48, the tensors are hidden 32.
  fs::create_directories(root / "other");
  fs::copy(checkpoint_, root / "other",
           fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  {
    const fs::path path = root / "other" / "model.safetensors.index.json";
    json index = json::parse(std::ifstream(path));
    index["extra"]["hidden_size"] = 48;
    std::ofstream(path) << index.dump();
  }
  expect_one_line(serve("--load " + shell_quoted((root / "other").string())),
                  "build the module with the checkpoint's sizes");

  // Not a te-encoder checkpoint: no config.
  fs::create_directories(root / "plain");
  fs::copy(checkpoint_, root / "plain",
           fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  {
    const fs::path path = root / "plain" / "model.safetensors.index.json";
    json index = json::parse(std::ifstream(path));
    index["extra"] = json::object();
    std::ofstream(path) << index.dump();
  }
  expect_one_line(serve("--load " + shell_quoted((root / "plain").string())), "'max_seq_len'");

  // A port someone else holds.
  Server holder({"--load", checkpoint_});
  ASSERT_GT(holder.port(), 0);
  const auto busy = run(std::string(TE_SERVE_PATH) + " --load " + shell_quoted(checkpoint_) +
                        " --port " + std::to_string(holder.port()));
  EXPECT_EQ(busy.first, 2) << busy.second;
  EXPECT_NE(busy.second.find("cannot listen on 127.0.0.1:" + std::to_string(holder.port())),
            std::string::npos)
      << busy.second;
  EXPECT_EQ(holder.stop(SIGTERM), 0);

  // More connections than the open-file limit allows.
  const auto files = run("ulimit -n 300 && " + std::string(TE_SERVE_PATH) + " --load " +
                         shell_quoted(checkpoint_) + " --port 0 --max-connections 1000");
  EXPECT_EQ(files.first, 2) << files.second;
  EXPECT_NE(files.second.find("te-serve: error: --max-connections 1000 needs more open files"),
            std::string::npos)
      << files.second;
}

TEST_F(Serve, ACheckpointSavedOnAMeshServesOnOneProcess) {
  // DP2 x TP2 (gated gelu MLP, Dense layers split column- then row-wise), 4 ranks as processes.
  const std::string tp_dir = (dir_->path() / "ckpt-tp").string();
  const auto [code, out] =
      run(std::string(TE_ENCODER_PATH) + " --data " + shell_quoted(TE_ENCODER_DATA) +
          " --nproc 4 --mesh data=2,model=2 --mesh-resource dp=data,tpsp=model --max-steps 6 "
          "--epochs 1 --batch-size 32 --hidden-size 32 --mlp-hidden-size 64 --heads 4 "
          "--max-seq-len 16 --save " +
          shell_quoted(tp_dir));
  ASSERT_EQ(code, 0) << out;
  // The dev accuracy the mesh computed at the end of training.
  const auto at = out.find("dev_acc ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string on_mesh = out.substr(at + 8, 6);
  const auto [eval_code, eval_out] =
      run(std::string(TE_SERVE_PATH) + " --load " + shell_quoted(tp_dir) + " --eval " +
          shell_quoted(std::string(TE_ENCODER_DATA) + "/in_domain_dev.tsv"));
  ASSERT_EQ(eval_code, 0) << eval_out;
  EXPECT_NE(eval_out.find("accuracy " + on_mesh), std::string::npos)
      << "te-encoder on the mesh: dev_acc " << on_mesh << "\n"
      << eval_out;
}

TEST(ServeHelp, DescribesEveryOption) {
  const auto [code, out] = run(std::string(TE_SERVE_PATH) + " --help");
  EXPECT_EQ(code, 0);
  for (const char* option : {"--load",
                             "--host",
                             "--port",
                             "--workers",
                             "--max-batch",
                             "--max-wait-ms",
                             "--max-queue",
                             "--max-request-sentences",
                             "--max-body-bytes",
                             "--fp8-weights",
                             "--export-fp8",
                             "--eval",
                             "--http-threads",
                             "--max-connections",
                             "--header-timeout",
                             "--body-timeout",
                             "--keep-alive-timeout",
                             "--write-timeout",
                             "--drain-timeout",
                             "POST /v1/classify",
                             "GET /metrics",
                             "SIGTERM"}) {
    EXPECT_NE(out.find(option), std::string::npos) << option;
  }
}

}  // namespace
