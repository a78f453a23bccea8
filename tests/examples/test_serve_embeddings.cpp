// te-serve --model as a client sees it: a small random BERT saved as a sentence-transformers
// folder (config.json, model.safetensors, tokenizer.json, modules.json, 1_Pooling/), served on a
// free loopback port; OpenAI embeddings requests (a string, a list, float and base64) answered
// with the vectors te::hf::SentenceEmbedder gives for the same folder, usage counted, truncation
// flagged, and every bad request answered with its status and a message naming the problem.
// (tests/interop/check_serve_openai.py holds the real all-MiniLM-L6-v2 to sentence-transformers
// through the official openai client.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../temp_dir.h"
#include "server_process.h"
#include "te/hf/sentence.h"
#include "te/nn/init.h"
#include "te/nn/safetensors.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using te::test::expect_error;
using te::test::Server;

// A random BERT of a 14-token WordPiece vocabulary, 12 positions, as a sentence-transformers
// folder with mean pooling and normalization.
void write_model(const fs::path& dir) {
  fs::create_directories(dir / "1_Pooling");
  const json config = {{"model_type", "bert"},    {"architectures", {"BertModel"}},
                       {"vocab_size", 14},        {"hidden_size", 16},
                       {"num_hidden_layers", 2},  {"num_attention_heads", 4},
                       {"intermediate_size", 24}, {"max_position_embeddings", 12},
                       {"type_vocab_size", 2},    {"hidden_act", "gelu"},
                       {"pad_token_id", 0}};
  std::ofstream(dir / "config.json") << config.dump();
  te::nn::manual_seed(11);
  te::hf::Encoder model(te::hf::parse_encoder_config(config.dump(), "config.json"));
  std::map<std::string, at::Tensor> whole;
  for (const auto& p : model->named_parameters()) whole[p.key()] = p.value().detach();
  te::nn::write_safetensors(
      (dir / "model.safetensors").string(),
      te::hf::to_hf_tensors(te::hf::encoder_weight_map(model->config), whole));
  const std::vector<std::string> vocab = {"[PAD]", "[UNK]",  "[CLS]", "[SEP]", "[MASK]",
                                          "hello", ",",      "world", "!",     "un",
                                          "##aff", "##able", "cafe",  "the"};
  std::ofstream txt(dir / "vocab.txt");
  for (const auto& t : vocab) txt << t << "\n";
  txt.close();
  std::ofstream(dir / "tokenizer_config.json") << json{{"do_lower_case", true}}.dump();
  std::ofstream(dir / "modules.json")
      << json::array({{{"idx", 0},
                       {"name", "0"},
                       {"path", ""},
                       {"type", "sentence_transformers.models.Transformer"}},
                      {{"idx", 1},
                       {"name", "1"},
                       {"path", "1_Pooling"},
                       {"type", "sentence_transformers.models.Pooling"}},
                      {{"idx", 2},
                       {"name", "2"},
                       {"path", "2_Normalize"},
                       {"type", "sentence_transformers.models.Normalize"}}})
             .dump();
  std::ofstream(dir / "1_Pooling" / "config.json") << json{
      {"word_embedding_dimension", 16},
      {"pooling_mode_cls_token", false},
      {"pooling_mode_mean_tokens", true},
      {"pooling_mode_max_tokens", false},
      {"pooling_mode_mean_sqrt_len_tokens", false}}.dump();
}

std::vector<float> floats_of(const json& j) {
  if (j.is_array()) return j.get<std::vector<float>>();
  // base64 of little-endian float32.
  const std::string s = j.get<std::string>();
  std::string bytes;
  int bits = 0;
  uint32_t v = 0;
  for (const char c : s) {
    const char* table = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char* at = std::strchr(table, c);
    if (c == '=' || at == nullptr) break;
    v = (v << 6) | static_cast<uint32_t>(at - table);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes += static_cast<char>((v >> bits) & 0xFF);
    }
  }
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

TEST(ServeEmbeddings, AnswersAsTheLibraryAndRefusesBadRequestsWithTheirStatus) {
  te::test::TempDir dir("te_serve_embeddings");
  write_model(dir.path());
  const std::string model = dir.path().string();
  const te::hf::SentenceEmbedder library(model);
  const std::vector<std::string> texts = {"Hello, world!", "the cafe", "unaffable world hello"};
  te::hf::SentenceEmbedder::Info info;
  const at::Tensor want = library.embed(texts, 0, &info);

  Server server({"--model", model, "--max-batch", "2", "--max-request-sentences", "4"});
  ASSERT_GT(server.port(), 0) << server.log();
  EXPECT_NE(server.log().find("16-dimensional embeddings, mean pooling, normalized, at most 12 "
                              "tokens"),
            std::string::npos)
      << server.log();
  httplib::Client c = server.client();
  for (const char* format : {"float", "base64"}) {
    const auto r =
        c.Post("/v1/embeddings",
               json{{"input", texts}, {"model", "x"}, {"encoding_format", format}}.dump(),
               "application/json");
    ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    const json body = json::parse(r->body);
    EXPECT_EQ(body["object"], "list");
    EXPECT_EQ(body["model"], dir.path().filename().string());
    ASSERT_EQ(body["data"].size(), texts.size());
    int64_t tokens = 0;
    for (std::size_t i = 0; i < texts.size(); ++i) {
      EXPECT_EQ(body["data"][i]["index"], i);
      EXPECT_EQ(body["data"][i]["object"], "embedding");
      const std::vector<float> got = floats_of(body["data"][i]["embedding"]);
      EXPECT_TRUE(at::allclose(at::tensor(got), want[static_cast<int64_t>(i)], 1e-5, 1e-6))
          << format << " row " << i;
      tokens += info.tokens[i];
    }
    EXPECT_EQ(body["usage"]["prompt_tokens"], tokens);
    EXPECT_EQ(body["usage"]["total_tokens"], tokens);
  }
  // One string; a text longer than the model's 12 positions is cut there and flagged.
  const auto one = c.Post("/v1/embeddings", R"({"input": "hello world"})", "application/json");
  ASSERT_TRUE(one && one->status == 200);
  EXPECT_EQ(json::parse(one->body)["data"].size(), 1u);
  std::string long_text;
  for (int i = 0; i < 20; ++i) long_text += "hello ";
  const auto cut =
      c.Post("/v1/embeddings", json{{"input", {long_text, "hello"}}}.dump(), "application/json");
  ASSERT_TRUE(cut && cut->status == 200);
  EXPECT_EQ(json::parse(cut->body)["truncated"], json::array({true, false}));
  EXPECT_EQ(json::parse(cut->body)["usage"]["prompt_tokens"], 12 + 3);

  auto post = [&](const std::string& body) {
    return c.Post("/v1/embeddings", body, "application/json");
  };
  expect_error(post("{\"input\": "), 400, "not JSON");
  expect_error(post("[1]"), 400, "the body is a JSON array");
  expect_error(post("{}"), 400, "the body has no \"input\"");
  expect_error(post(R"({"input": []})"), 400, "\"input\" is empty");
  expect_error(post(R"({"input": ["a", ""]})"), 400, "input[1] is empty");
  expect_error(post(R"({"input": 3})"), 400, "\"input\" is a JSON number");
  expect_error(post(R"({"input": [[1, 2]]})"), 400, "send strings, not token ids");
  expect_error(post(R"({"input": ["a", 2]})"), 400, "input[1] is a JSON number");
  expect_error(post(R"({"input": "a", "encoding_format": "int8"})"), 400,
               "\"encoding_format\" is \"int8\"");
  expect_error(post(R"({"input": "a", "dimensions": 8})"), 400,
               "this model's embeddings have 16 dimensions");
  expect_error(post(R"({"input": "a", "temperature": 1})"), 400, "\"temperature\" is not a field");
  expect_error(post(R"({"input": ["a", "b", "c", "d", "e"]})"), 413, "at most 4 per request");
  expect_error(post("{\"input\": \"\xff\"}"), 400, "not valid UTF-8");
  expect_error(c.Post("/v1/classify", R"({"sentences": ["a"]})", "application/json"), 404,
               "use POST /v1/embeddings");
  // The server still answers, and says how many requests it took.
  const auto after = post(R"({"input": "hello"})");
  ASSERT_TRUE(after && after->status == 200);
  const auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics && metrics->status == 200);
  EXPECT_NE(metrics->body.find("te_serve_requests_total{path=\"/v1/embeddings\",status=\"400\"}"),
            std::string::npos);
  EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST(ServeEmbeddings, ServesFp8WeightsCalibratedOnAFileAsTheLibraryDoes) {
  te::test::TempDir dir("te_serve_embeddings_fp8");
  write_model(dir.path() / "model");
  const std::string model = (dir.path() / "model").string();
  const std::vector<std::string> calibration = {"hello, world!", "the unaffable cafe",
                                                "world hello world"};
  std::ofstream(dir.path() / "calibration.txt") << "hello, world!\nthe unaffable cafe\n\n"
                                                   "world hello world\n";
  te::hf::SentenceEmbedder library(model);
  const at::Tensor fp32 = library.embed({"hello cafe"});
  library.freeze_fp8_weights(calibration);
  const at::Tensor want = library.embed({"hello cafe"});
  ASSERT_FALSE(at::allclose(want, fp32, 1e-6, 1e-6));  // the FP8 answer is its own

  const std::string file = (dir.path() / "calibration.txt").string();
  Server server({"--model", model, "--fp8-weights", "--calibration", file});
  ASSERT_GT(server.port(), 0) << server.log();
  EXPECT_NE(server.log().find("fp8 weights"), std::string::npos) << server.log();
  const auto r =
      server.client().Post("/v1/embeddings", R"({"input": "hello cafe"})", "application/json");
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
  const std::vector<float> got = floats_of(json::parse(r->body)["data"][0]["embedding"]);
  EXPECT_TRUE(at::allclose(at::tensor(got), want[0], 1e-5, 1e-6));
  EXPECT_EQ(server.stop(), 0) << server.log();

  // --fp8-weights without --calibration (and the reverse) stop the start, named.
  const std::string serve =
      std::string(TE_SERVE_PATH) + " --model " + te::test::shell_quoted(model);
  for (const std::string& flags : {std::string(" --fp8-weights"), " --calibration " + file}) {
    const auto [code, out] = te::test::run(serve + flags);
    EXPECT_EQ(code, 2) << flags << ": " << out;
    EXPECT_NE(out.find("--fp8-weights needs --calibration FILE"), std::string::npos) << out;
  }
  const auto [missing, missing_out] =
      te::test::run(serve + " --fp8-weights --calibration " + file + ".absent");
  EXPECT_EQ(missing, 2) << missing_out;
  EXPECT_NE(missing_out.find("--calibration: cannot read"), std::string::npos) << missing_out;
}

#ifdef TE_EMBED_PATH
// The float32 values of a .npy file te-embed --output wrote (format 1.0: magic, version, a
// little-endian header length, the header, the data).
std::vector<float> read_npy(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.compare(0, 8, std::string("\x93NUMPY\x01\x00", 8)), 0);
  const std::size_t header = static_cast<unsigned char>(bytes[8]) |
                             static_cast<std::size_t>(static_cast<unsigned char>(bytes[9])) << 8;
  EXPECT_EQ((10 + header) % 64, 0u);
  EXPECT_NE(bytes.find("'descr': '<f4'"), std::string::npos);
  std::vector<float> out((bytes.size() - 10 - header) / 4);
  std::memcpy(out.data(), bytes.data() + 10 + header, out.size() * 4);
  return out;
}

TEST(TeEmbed, WritesTheLibrarysEmbeddingsFp32AndFp8AndNamesBadFlags) {
  te::test::TempDir dir("te_embed_cli");
  write_model(dir.path() / "model");
  const std::string model = (dir.path() / "model").string();
  const std::vector<std::string> lines = {"hello, world!", "the unaffable cafe", "world"};
  std::ofstream(dir.path() / "in.txt") << "hello, world!\nthe unaffable cafe\n\nworld\n";
  std::ofstream(dir.path() / "calibration.txt") << "hello cafe\nunaffable world, hello!\n";
  const std::string embed = std::string(TE_EMBED_PATH) + " --model " + model + " --input " +
                            (dir.path() / "in.txt").string() + " --output ";
  te::hf::SentenceEmbedder library(model);
  for (const bool fp8 : {false, true}) {
    if (fp8) library.freeze_fp8_weights({"hello cafe", "unaffable world, hello!"});
    const at::Tensor want = library.embed(lines);
    const fs::path out = dir.path() / (fp8 ? "fp8.npy" : "fp32.npy");
    const auto [code, log] = te::test::run(
        embed + out.string() +
        (fp8 ? " --fp8-weights --calibration " + (dir.path() / "calibration.txt").string() : ""));
    ASSERT_EQ(code, 0) << log;
    const std::vector<float> got = read_npy(out);
    ASSERT_EQ(static_cast<int64_t>(got.size()), want.numel()) << fp8;
    EXPECT_TRUE(at::allclose(at::tensor(got).view(want.sizes()), want, 1e-5, 1e-6)) << fp8;
  }
  const std::string base = std::string(TE_EMBED_PATH) + " --model " + model;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {" --fp8-weights --nproc 2 a b", "--fp8-weights serves on one process; drop --nproc"},
      {" --calibration x.txt a b", "--calibration needs --fp8-weights"},
      {" a", "give at least two sentences to compare"},
      {" --bench x.txt a b", "--bench measures over its own file"},
      {" --input " + (dir.path() / "absent.txt").string() + " --output o.npy", "cannot read"},
      {" --fp8-weights --calibration " + (dir.path() / "absent.txt").string() + " a b",
       "cannot read"}};
  for (const auto& [flags, message] : bad) {
    const auto [code, log] = te::test::run(base + flags);
    EXPECT_NE(code, 0) << flags;
    EXPECT_NE(log.find(message), std::string::npos) << flags << ": " << log;
  }
}
#endif

TEST(ServeEmbeddings, ABadModelFolderStopsTheStartWithOneLineAndExitCode2) {
  te::test::TempDir dir("te_serve_embeddings_bad");
  write_model(dir.path());
  const std::string model = dir.path().string();
  std::ofstream(dir.path() / "1_Pooling" / "config.json")
      << json{{"pooling_mode_max_tokens", true}}.dump();
  const auto [code, out] =
      te::test::run(std::string(TE_SERVE_PATH) + " --model " + te::test::shell_quoted(model));
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("pooling_mode_max_tokens: true: te-cpp pools by mean or CLS only"),
            std::string::npos)
      << out;
  const auto [both, both_out] =
      te::test::run(std::string(TE_SERVE_PATH) + " --model " + model + " --load " + model);
  EXPECT_NE(both, 0);
  EXPECT_NE(both_out.find("excludes"), std::string::npos) << both_out;
  const auto [none, none_out] = te::test::run(TE_SERVE_PATH);
  EXPECT_EQ(none, 2);
  EXPECT_NE(none_out.find("give --load CHECKPOINT (classify) or --model DIR (embeddings)"),
            std::string::npos)
      << none_out;
}

}  // namespace
