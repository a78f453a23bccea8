// A load client for OpenAI-compatible completion servers (te-serve with a decoder model, or
// llama.cpp's llama-server): `--streams` clients each send streaming POST /v1/completions
// requests back to back for `--seconds`, every request a different prompt of about
// `--prompt-words` words and exactly `--max-tokens` generated tokens (greedy, ignore_eos). It
// reports what a user of the server sees: time to first token and inter-token latency (p50,
// p99), aggregate tokens/s over the run, aggregate decode tokens/s (the tokens after each
// request's first, over the time some stream was between its first and last token: the rate
// while decoding, without the time every stream waits on prefills), errors (a status other than
// 200, or a stream without its finish_reason and [DONE]), and with --metrics the largest
// te_serve_running_sequences /metrics showed. With --crowd SLOW,IDLE it first opens SLOW slowloris
// connections (a header line a second, never finished) and IDLE keep-alive ones (one GET, then
// silence), held for the run: what a server's latencies are with them.
// scripts/serve-generate-bench.sh runs it against both servers.
//
//   bench_serve_load --port 8080 --streams 32 --seconds 60 --max-tokens 64 [--json]
//   bench_serve_load --port 8080 --prefill 512     # one request: prompt tokens/s

#include <httplib.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../tests/examples/crowd.h"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string host = "127.0.0.1";
  int port = 8080;
  int streams = 1;
  double seconds = 30;
  int max_tokens = 64;
  int prompt_words = 32;
  int prefill = 0;
  int max_length = 0;  // --mixed: prompt words drawn up to this
  bool metrics = false, json_out = false;
  std::string label;
  std::vector<int> crowd;  // --crowd SLOW,IDLE
};

// A prompt of about `words` words, different for every (client, request).
std::string prompt_of(int client, int request, int words) {
  static const char* kWords[] = {"river", "stone",  "light",  "winter", "garden", "engine",
                                 "paper", "market", "signal", "forest", "letter", "window"};
  std::ostringstream p;
  p << "Story " << client << "." << request << ":";
  for (int i = 0; i < words; ++i) p << ' ' << kWords[(client * 7 + request * 3 + i * 5) % 12];
  return p.str();
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

struct Totals {
  std::mutex mu;
  std::vector<double> ttft, itl;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> decoding;  // first, last token
  int64_t tokens = 0, decode_tokens = 0, requests = 0, errors = 0;
  std::string first_error;
};

// The decode tokens over the length of the union of the decoding intervals.
double decode_tokens_per_s(Totals& t) {
  std::sort(t.decoding.begin(), t.decoding.end());
  double covered = 0;
  std::optional<std::pair<Clock::time_point, Clock::time_point>> run;
  auto close = [&] {
    if (run) covered += std::chrono::duration<double>(run->second - run->first).count();
  };
  for (const auto& d : t.decoding) {
    if (run && d.first <= run->second) {
      run->second = std::max(run->second, d.second);
    } else {
      close();
      run = d;
    }
  }
  close();
  return covered > 0 ? static_cast<double>(t.decode_tokens) / covered : 0;
}

// One client: streaming requests back to back until `end`.
void client(const Args& a, int index, Clock::time_point end, Totals& totals) {
  httplib::Client http(a.host, a.port);
  http.set_read_timeout(600, 0);
  for (int request = 0; Clock::now() < end; ++request) {
    int words = a.prompt_words;
    if (a.max_length > 0) words = 8 + (index * 37 + request * 101) % a.max_length;
    const json body = {{"prompt", prompt_of(index, request, words)},
                       {"max_tokens", a.max_tokens},
                       {"temperature", 0},
                       {"ignore_eos", true},
                       {"stream", true}};
    std::vector<double> itl;
    double ttft = -1;
    int64_t tokens = 0;
    bool finished = false, done = false;
    std::string pending;
    const auto start = Clock::now();
    auto last = start, first = start;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, std::size_t n, uint64_t, uint64_t) {
      pending.append(data, n);
      for (std::size_t at; (at = pending.find("\n\n")) != std::string::npos;) {
        const std::string event = pending.substr(0, at);
        pending.erase(0, at + 2);
        if (event.rfind("data: ", 0) != 0) continue;
        if (event == "data: [DONE]") {
          done = true;
          continue;
        }
        const json j = json::parse(event.substr(6), nullptr, false);
        if (j.is_discarded() || !j.contains("choices") || j["choices"].empty()) continue;
        const json& c = j["choices"][0];
        if (c.contains("finish_reason") && !c["finish_reason"].is_null()) finished = true;
        if (c.value("text", "").empty()) continue;
        const auto now = Clock::now();
        if (ttft < 0) {
          ttft = std::chrono::duration<double>(now - start).count();
          first = now;
        } else {
          itl.push_back(std::chrono::duration<double>(now - last).count());
        }
        last = now;
        ++tokens;
      }
      return true;
    };
    auto res = http.send(req);
    std::lock_guard<std::mutex> lock(totals.mu);
    ++totals.requests;
    if (!res || res->status != 200 || !finished || !done) {
      ++totals.errors;
      if (totals.first_error.empty()) {
        totals.first_error = !res ? "no response: " + httplib::to_string(res.error())
                                  : "status " + std::to_string(res->status) + " " + res->body +
                                        (finished ? "" : " (no finish_reason)") +
                                        (done ? "" : " (no [DONE])");
      }
      continue;
    }
    if (ttft >= 0) totals.ttft.push_back(ttft);
    totals.itl.insert(totals.itl.end(), itl.begin(), itl.end());
    totals.tokens += tokens;
    if (tokens > 1) {
      totals.decoding.emplace_back(first, last);
      totals.decode_tokens += tokens - 1;
    }
  }
}

// The value of te_serve_running_sequences in /metrics, or -1.
double running(httplib::Client& http) {
  auto r = http.Get("/metrics");
  if (!r || r->status != 200) return -1;
  std::istringstream in(r->body);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("te_serve_running_sequences ", 0) == 0) return std::stod(line.substr(27));
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A streaming load client for OpenAI-compatible completion servers"};
  Args a;
  app.add_option("--host", a.host);
  app.add_option("--port", a.port)->required();
  app.add_option("--streams", a.streams, "concurrent clients")->check(CLI::Range(1, 4096));
  app.add_option("--seconds", a.seconds, "how long the clients send requests");
  app.add_option("--max-tokens", a.max_tokens, "tokens each request generates (ignore_eos)");
  app.add_option("--prompt-words", a.prompt_words, "words in each prompt");
  app.add_option("--mixed", a.max_length,
                 "prompts of 8 to this many words, varied over the requests (a mixed-length "
                 "workload)");
  app.add_option("--prefill", a.prefill,
                 "instead: one request of about this many prompt words and one token, 3 times; "
                 "prints the best prompt tokens/s");
  app.add_flag("--metrics", a.metrics, "sample te-serve's /metrics for the most running sequences");
  app.add_option("--label", a.label, "a name for the output");
  app.add_option("--crowd", a.crowd,
                 "SLOW,IDLE: hold SLOW slowloris and IDLE idle keep-alive connections open "
                 "during the run")
      ->expected(2)
      ->delimiter(',')
      ->check(CLI::Range(0, 20000));
  app.add_flag("--json", a.json_out, "one JSON object");
  CLI11_PARSE(app, argc, argv);

  if (a.prefill > 0) {
    httplib::Client http(a.host, a.port);
    http.set_read_timeout(600, 0);
    double best = 0;
    int64_t tokens = 0;
    for (int i = 0; i < 3; ++i) {
      const json body = {
          {"prompt", prompt_of(1000 + i, 0, a.prefill)}, {"max_tokens", 1}, {"temperature", 0}};
      const auto start = Clock::now();
      auto r = http.Post("/v1/completions", body.dump(), "application/json");
      const double s = std::chrono::duration<double>(Clock::now() - start).count();
      if (!r || r->status != 200) {
        std::fprintf(stderr, "bench_serve_load: prefill request failed: %s\n",
                     r ? r->body.c_str() : httplib::to_string(r.error()).c_str());
        return 1;
      }
      tokens = json::parse(r->body)["usage"]["prompt_tokens"].get<int64_t>();
      best = std::max(best, static_cast<double>(tokens) / s);
    }
    const json out = {
        {"label", a.label}, {"prompt_tokens", tokens}, {"prefill_tokens_per_s", best}};
    std::printf("%s\n", a.json_out ? out.dump().c_str()
                                   : ("prefill " + std::to_string(tokens) +
                                      " tokens: " + std::to_string(best) + " tokens/s")
                                         .c_str());
    return 0;
  }

  std::unique_ptr<te::test::Crowd> crowd;
  if (!a.crowd.empty()) {
    crowd = std::make_unique<te::test::Crowd>(a.port, a.crowd[0], a.crowd[1]);
    if (static_cast<int>(crowd->slow().size()) != a.crowd[0] ||
        crowd->idle_answered() != a.crowd[1]) {
      std::fprintf(stderr,
                   "bench_serve_load: --crowd: %zu of %d slow and %d of %d idle connections "
                   "made (ulimit -n?)\n",
                   crowd->slow().size(), a.crowd[0], crowd->idle_answered(), a.crowd[1]);
      return 1;
    }
  }
  Totals totals;
  const auto start = Clock::now();
  const auto end =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.seconds));
  std::atomic<bool> sampling{a.metrics};
  double most_running = -1;
  std::thread sampler([&] {
    if (!a.metrics) return;
    httplib::Client http(a.host, a.port);
    while (sampling.load()) {
      most_running = std::max(most_running, running(http));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  std::vector<std::thread> clients;
  for (int i = 0; i < a.streams; ++i) {
    clients.emplace_back([&, i] { client(a, i, end, totals); });
  }
  for (auto& t : clients) t.join();
  sampling = false;
  sampler.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  const json out = {{"label", a.label},
                    {"streams", a.streams},
                    {"seconds", elapsed},
                    {"requests", totals.requests},
                    {"errors", totals.errors},
                    {"tokens", totals.tokens},
                    {"tokens_per_s", static_cast<double>(totals.tokens) / elapsed},
                    {"decode_tokens_per_s", decode_tokens_per_s(totals)},
                    {"ttft_p50_s", percentile(totals.ttft, 0.5)},
                    {"ttft_p99_s", percentile(totals.ttft, 0.99)},
                    {"itl_p50_s", percentile(totals.itl, 0.5)},
                    {"itl_p99_s", percentile(totals.itl, 0.99)},
                    {"most_running", most_running},
                    {"crowd", a.crowd.empty() ? json(nullptr) : json(a.crowd)}};
  if (a.json_out) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf(
        "%s%d streams, %.1f s: %lld requests, %lld errors, %.1f tokens/s (decoding %.1f); TTFT "
        "p50 %.3f s p99 "
        "%.3f s; ITL p50 %.1f ms p99 %.1f ms%s\n",
        a.label.empty() ? "" : (a.label + ": ").c_str(), a.streams, elapsed,
        static_cast<long long>(totals.requests), static_cast<long long>(totals.errors),
        static_cast<double>(totals.tokens) / elapsed, decode_tokens_per_s(totals),
        percentile(totals.ttft, 0.5), percentile(totals.ttft, 0.99),
        1e3 * percentile(totals.itl, 0.5), 1e3 * percentile(totals.itl, 0.99),
        a.metrics
            ? (", at most " + std::to_string(static_cast<int>(most_running)) + " sequences running")
                  .c_str()
            : "");
  }
  if (!totals.first_error.empty())
    std::fprintf(stderr, "first error: %s\n", totals.first_error.c_str());
  return totals.errors == 0 ? 0 : 1;
}
