// Generation: te::nn::InferenceParams (TE's KV cache: contiguous and paged) step by step, cached
// steps equal to the full forward for every model family, greedy decoding with the cache equal
// to recomputation for 256 tokens, the sampler's filters, seeded sampling whatever the batch,
// chunked prefill and preemption keeping the tokens, and tensor parallel equal to one process.

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <variant>

#include "../expect_error.h"
#include "../temp_dir.h"
#include "bpe_json.h"
#include "te/distributed.h"
#include "te/gen/chat_template.h"
#include "te/gen/generate.h"
#include "te/gen/text_stream.h"
#include "te/hf/causal_lm.h"
#include "te/hf/chat.h"
#include "te/hf/tokenizer.h"
#include "te/nn/init.h"
#include "te/nn/kv_cache.h"
#include "te/nn/sharded.h"

namespace te::hf {
namespace {

using nlohmann::json;
// Generation is te::gen's (over a te::hf::CausalLM and te::hf::Tokenizer).
using te::gen::ChatTemplate;
using te::gen::Engine;
using te::gen::EngineOptions;
using te::gen::generate;
using te::gen::Generated;
using te::gen::GenerateOptions;
using te::gen::Sampler;
using te::gen::SamplingOptions;
using te::gen::TextStream;
using te::gen::TokenEvent;
using te::nn::InferenceParams;
using te::nn::InferenceParamsOptions;

json tiny(const std::string& type, int64_t positions = 64) {
  if (type == "gpt2") {
    return {{"model_type", "gpt2"},
            {"architectures", {"GPT2LMHeadModel"}},
            {"vocab_size", 64},
            {"n_embd", 16},
            {"n_layer", 2},
            {"n_head", 4},
            {"n_positions", positions}};
  }
  json c = {{"model_type", type},
            {"architectures",
             {type == "llama"     ? "LlamaForCausalLM"
              : type == "mistral" ? "MistralForCausalLM"
              : type == "qwen2"   ? "Qwen2ForCausalLM"
              : type == "phi3"    ? "Phi3ForCausalLM"
                                  : "Qwen3ForCausalLM"}},
            {"vocab_size", 64},
            {"hidden_size", 16},
            {"intermediate_size", 24},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"max_position_embeddings", positions},
            {"rms_norm_eps", 1e-5},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", type == "qwen3"},
            {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}};
  if (type == "mistral") c["sliding_window"] = 4;   // shorter than the prompts: the window shows
  if (type == "phi3") c["pad_token_id"] = nullptr;  // Phi3Config's 32000 is beyond 64 tokens
  if (type == "gemma2") {  // layer 0 slides; both soft caps reached by these logits
    c["architectures"] = {"Gemma2ForCausalLM"};
    c["head_dim"] = 8;
    c["query_pre_attn_scalar"] = 8;
    c["sliding_window"] = 4;
    c["attn_logit_softcapping"] = 2.0;
    c["final_logit_softcapping"] = 3.0;
    c["hidden_activation"] = "gelu_pytorch_tanh";
  }
  if (type == "gemma3") {  // q/k norms; layer 0 slides with its own RoPE base, layer 1 is global
    c["architectures"] = {"Gemma3ForCausalLM"};
    c["model_type"] = "gemma3_text";
    c["head_dim"] = 8;
    c["query_pre_attn_scalar"] = 8;
    c["sliding_window"] = 4;
    c["sliding_window_pattern"] = 2;
    c["final_logit_softcapping"] = 3.0;
    c["rope_parameters"] = {
        {"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}},
        {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10.0}}}};
  }
  return c;
}

CausalLM model_of(const json& config, uint64_t seed = 3) {
  te::nn::manual_seed(seed);
  CausalLM m(parse_causal_lm_config(config.dump(), "config.json"));
  // Larger weights than the init's, so the logits are far apart and argmax is no coin toss.
  torch::NoGradGuard no_grad;
  for (auto& p : m->parameters()) {
    if (p.dim() >= 2) p.mul_(3);
  }
  m->eval();
  return m;
}

at::Tensor packed(const std::vector<int64_t>& ids) { return at::tensor(ids, at::kLong); }

std::vector<int64_t> tokens(int64_t n, int64_t from) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) out.push_back((from + 7 * i) % 64);
  return out;
}

// ---- the cache ----------------------------------------------------------------------------

TEST(KvCache, PreStepPacksInTheCallersOrderAndFreesEndedSequences) {
  InferenceParams cache(
      InferenceParamsOptions(4, 32, 2, 3).is_paged(true).page_size(4).total_num_pages(6));
  cache.pre_step({{7, 5}, {3, 2}});
  EXPECT_TRUE(at::equal(cache.cu_seqlens_q(), packed({0, 5, 7})));
  EXPECT_TRUE(at::equal(cache.cu_seqlens_kv(), packed({0, 5, 7})));
  EXPECT_TRUE(at::equal(cache.pre_step_seqlens(), packed({0, 0})));
  EXPECT_EQ(cache.free_blocks(), 3);  // 2 pages for 5 tokens, 1 for 2
  const at::Tensor k1 = at::randn({7, 2, 3}), v1 = at::randn({7, 2, 3});
  auto [k, v] = cache.step(0, k1, v1);  // TE's bshd: [2 sequences, 5 positions, 2 heads, 3]
  ASSERT_EQ(k.sizes(), (std::vector<int64_t>{2, 5, 2, 3}));
  EXPECT_TRUE(at::equal(k[0], k1.slice(0, 0, 5)));
  EXPECT_TRUE(at::equal(v[1].slice(0, 0, 2), v1.slice(0, 5, 7)));
  EXPECT_TRUE(at::equal(k[1].slice(0, 2), at::zeros({3, 2, 3})));  // padding reads zeros
  // Padding hides sequence 3's keys past its 2 and its queries past its 2 new tokens.
  EXPECT_TRUE(at::equal(cache.padding_mask()[1][0][1], packed({0, 0, 1, 1, 1}).to(at::kBool)));
  EXPECT_TRUE(at::equal(cache.padding_mask()[1][0][2], at::ones({5}, at::kBool)));
  EXPECT_TRUE(at::equal(cache.query_rows(), packed({0, 1, 2, 3, 4, 5, 6})));

  // 7 has ended (absent), 3 continues with 3 tokens, 9 starts: in that order.
  cache.pre_step({{3, 3}, {9, 4}});
  EXPECT_EQ(cache.sequence_ids(), (std::vector<int64_t>{3, 9}));
  EXPECT_TRUE(at::equal(cache.cu_seqlens_q(), packed({0, 3, 7})));
  EXPECT_TRUE(at::equal(cache.cu_seqlens_kv(), packed({0, 5, 9})));
  EXPECT_TRUE(at::equal(cache.pre_step_seqlens(), packed({2, 0})));
  EXPECT_EQ(cache.seqlen(7), 0);
  EXPECT_EQ(cache.free_blocks(), 6 - 2 - 1);  // 3: 5 tokens in 2 pages; 9: 4 tokens in 1
  EXPECT_TRUE(at::equal(cache.query_rows(), packed({0, 1, 2, 4, 5, 6, 7})));  // max_q 4
  const at::Tensor k2 = at::randn({7, 2, 3});
  std::tie(k, v) = cache.step(0, k2, k2);
  EXPECT_TRUE(at::equal(k[0].slice(0, 0, 2), k1.slice(0, 5, 7)));  // 3's cached tokens
  EXPECT_TRUE(at::equal(k[0].slice(0, 2, 5), k2.slice(0, 0, 3)));
  EXPECT_TRUE(at::equal(k[1].slice(0, 0, 4), k2.slice(0, 3, 7)));
  EXPECT_ERROR(cache.step(0, k2, k2), "layer 0 was already stepped since pre_step");
  // A second layer has its own memory.
  std::tie(k, v) = cache.step(1, k2, k2);
  EXPECT_TRUE(at::equal(k[0].slice(0, 0, 2), at::zeros({2, 2, 3})));  // never written there
}

TEST(KvCache, AStepThatDoesNotFitIsRefusedByNameAndChangesNothing) {
  InferenceParams cache(
      InferenceParamsOptions(2, 10, 2, 3).is_paged(true).page_size(4).total_num_pages(3));
  cache.pre_step({{1, 6}});
  auto unchanged = [&] {
    EXPECT_EQ(cache.seqlen(1), 6);
    EXPECT_EQ(cache.free_blocks(), 1);
    EXPECT_EQ(cache.sequence_ids(), std::vector<int64_t>{1});
  };
  EXPECT_ERROR(cache.pre_step({{1, 1}, {1, 1}}), "sequence 1 appears twice in the step");
  EXPECT_ERROR(cache.pre_step({{1, 0}}), "sequence 1 brings 0 new tokens (at least 1)");
  EXPECT_ERROR(cache.pre_step({{1, 1}, {2, 1}, {3, 1}}),
               "3 sequences are more than max_batch_size 2");
  EXPECT_ERROR(cache.pre_step({{1, 5}}),
               "sequence 1 would hold 11 tokens, more than max_sequence_length 10");
  EXPECT_ERROR(cache.pre_step({{1, 1}, {2, 5}}), "the step needs 2 more pages and 1 are free");
  EXPECT_ERROR(cache.pre_step({}), "the step has no sequences");
  unchanged();
  EXPECT_ERROR(cache.step(0, at::zeros({5, 2, 3}), at::zeros({5, 2, 3})),
               "the step has 6 new tokens, so [6, kv heads, 3]");
  EXPECT_ERROR(cache.step(0, at::zeros({6, 4, 3}), at::zeros({6, 4, 3})),
               "gives 4 key/value heads, not a share of the cache's num_heads_kv 2");
  // Ending sequence 1 gives its pages to the next.
  cache.pre_step({{2, 10}});
  EXPECT_EQ(cache.free_blocks(), 0);
  EXPECT_ERROR(InferenceParams(InferenceParamsOptions(2, 10, 2, 3).is_paged(true)),
               "is_paged needs page_size (0) and total_num_pages (0) > 0");
  EXPECT_ERROR(InferenceParams(InferenceParamsOptions(2, 10, 2, 3).page_size(4)),
               "page_size and total_num_pages are for is_paged(true)");
}

// ---- the model's cached steps -------------------------------------------------------------

class CachedSteps : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

// Prompts of 5 and 9 tokens prefilled together, then a chunk of 3 beside a single token, then
// decoding: each step's logits equal the full forward's at each sequence's last token.
TEST_P(CachedSteps, EqualTheFullForwardAtEachSequencesLastToken) {
  const auto& [type, paged] = GetParam();
  CausalLM model = model_of(tiny(type));
  c10::InferenceMode inference;
  auto options = cache_options(model->config, 3);
  if (paged) options.is_paged(true).page_size(4).total_num_pages(16);
  InferenceParams cache(options);
  std::map<int64_t, std::vector<int64_t>> seqs;
  auto run = [&](const std::vector<std::pair<int64_t, std::vector<int64_t>>>& step) {
    std::vector<std::pair<int64_t, int64_t>> counts;
    std::vector<int64_t> ids;
    for (const auto& [id, toks] : step) {
      counts.emplace_back(id, static_cast<int64_t>(toks.size()));
      ids.insert(ids.end(), toks.begin(), toks.end());
      seqs[id].insert(seqs[id].end(), toks.begin(), toks.end());
    }
    cache.pre_step(counts);
    const at::Tensor logits = model->step(packed(ids), cache);
    ASSERT_EQ(logits.size(0), static_cast<int64_t>(step.size()));
    for (std::size_t i = 0; i < step.size(); ++i) {
      const auto& all = seqs[step[i].first];
      const at::Tensor want = model->forward(packed(all).unsqueeze(0)).select(0, 0).select(0, -1);
      EXPECT_TRUE(at::allclose(logits[static_cast<int64_t>(i)], want, 1e-4, 1e-5))
          << type << " sequence " << step[i].first << " at " << all.size() << " tokens: max diff "
          << (logits[static_cast<int64_t>(i)] - want).abs().max().item<float>();
    }
  };
  run({{0, tokens(5, 1)}, {1, tokens(9, 2)}});
  run({{1, tokens(1, 3)}, {0, tokens(3, 4)}});  // a chunk beside a decode, the order swapped
  run({{0, tokens(1, 5)}, {1, tokens(1, 6)}, {2, tokens(6, 7)}});
  run({{2, tokens(1, 8)}, {1, tokens(1, 9)}});  // 0 has ended
}

INSTANTIATE_TEST_SUITE_P(Families, CachedSteps,
                         ::testing::Combine(::testing::Values("llama", "mistral", "qwen2", "qwen3",
                                                              "phi3", "gemma2", "gemma3", "gpt2"),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) ? "_paged" : "_contiguous");
                         });

// LongRoPE (original length 8): a step on either side equals the full forward (short factors for
// 5 tokens, long for 10); a step mixing the sides, or taking a sequence past 8 with keys cached
// under the short factors (transformers' generate would recompute them), is refused by name; an
// Engine generates within the 8 positions.
TEST(CachedSteps, LongRopeHoldsOnEachSideAndRefusesACrossing) {
  json config = tiny("phi3");
  config["original_max_position_embeddings"] = 8;
  config["rope_parameters"] = {
      {"rope_type", "longrope"}, {"short_factor", {1.0, 2.0}}, {"long_factor", {3.0, 20.0}}};
  CausalLM model = model_of(config);
  EXPECT_EQ(model->max_positions(), 8);
  c10::InferenceMode inference;
  auto step = [&](InferenceParams& cache, const std::vector<std::pair<int64_t, int64_t>>& counts,
                  const std::vector<int64_t>& ids) {
    cache.pre_step(counts);
    return model->step(packed(ids), cache);
  };
  auto last = [&](const std::vector<int64_t>& ids) {
    return model->forward(packed(ids).unsqueeze(0)).select(0, 0).select(0, -1);
  };
  // TE's cache frees a sequence a step leaves out: one cache for each side.
  InferenceParams short_cache(cache_options(model->config, 1)), long_cache(short_cache.options());
  EXPECT_TRUE(
      at::allclose(step(short_cache, {{0, 5}}, tokens(5, 1))[0], last(tokens(5, 1)), 1e-4, 1e-5));
  EXPECT_TRUE(
      at::allclose(step(long_cache, {{1, 10}}, tokens(10, 2))[0], last(tokens(10, 2)), 1e-4, 1e-5));
  InferenceParams mixed(cache_options(model->config, 2));
  std::vector<int64_t> both = tokens(5, 1);
  for (int64_t t : tokens(3, 2)) both.push_back(t);
  step(mixed, {{0, 5}, {1, 3}}, both);
  both = tokens(1, 3);
  for (int64_t t : tokens(6, 4)) both.push_back(t);
  EXPECT_ERROR(step(mixed, {{0, 1}, {1, 6}}, both),
               "longest sequence (9 tokens), and sequence 0 (6 tokens) is on the other side of "
               "original_max_position_embeddings 8");
  InferenceParams crossing(cache_options(model->config, 1));
  step(crossing, {{0, 5}}, tokens(5, 1));
  EXPECT_ERROR(step(crossing, {{0, 4}}, tokens(4, 2)),
               "sequence 0 grows past original_max_position_embeddings 8 (LongRoPE) with its "
               "first 5 keys cached under the short factors");
}

// ---- decoding -------------------------------------------------------------------------------

GenerateOptions greedy(int64_t max_tokens) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.sampling.temperature = 0;
  return o;
}

TEST(Generate, GreedyWithTheCacheEqualsRecomputationFor256Tokens) {
  CausalLM model = model_of(tiny("llama", 300));
  const std::vector<int64_t> prompt = tokens(7, 1);
  const Generated g = generate(model, {prompt}, greedy(256))[0];
  ASSERT_EQ(g.tokens.size(), 256u);
  EXPECT_EQ(g.finish_reason, "length");
  // Recomputation: the full forward over the prompt and the generated tokens chooses, at every
  // position, the token generated next (greedy decoding without a cache, token for token).
  std::vector<int64_t> all = prompt;
  all.insert(all.end(), g.tokens.begin(), g.tokens.end() - 1);
  c10::InferenceMode inference;
  const at::Tensor full = model->forward(packed(all).unsqueeze(0)).select(0, 0);
  const at::Tensor chosen = full.slice(0, static_cast<int64_t>(prompt.size()) - 1).argmax(-1);
  EXPECT_TRUE(at::equal(chosen, packed(g.tokens)));
  // The tokens are not one token repeated (the test would not show much).
  EXPECT_GT(std::set<int64_t>(g.tokens.begin(), g.tokens.end()).size(), 8u);
}

GenerateOptions sampled(uint64_t seed) {
  GenerateOptions o;
  o.max_tokens = 24;
  o.sampling.temperature = 0.9;
  o.sampling.top_p = 0.95;
  o.sampling.top_k = 40;
  o.sampling.seed = seed;
  o.top_logprobs = 2;
  return o;
}

TEST(Generate, SeededSamplingGivesTheSameTokensWhateverElseIsInTheBatch) {
  CausalLM model = model_of(tiny("qwen2"));
  const auto alone = generate(model, {tokens(6, 1)}, sampled(11))[0];
  Engine engine(model);
  engine.add(tokens(9, 4), sampled(5));
  const int64_t id = engine.add(tokens(6, 1), sampled(11));
  engine.add(tokens(3, 2), sampled(11));
  std::vector<int64_t> got;
  while (!engine.idle()) {
    for (const TokenEvent& e : engine.step()) {
      if (e.request == id) got.push_back(e.token);
    }
  }
  EXPECT_EQ(got, alone.tokens);
  EXPECT_NE(alone.tokens, generate(model, {tokens(6, 1)}, sampled(12))[0].tokens);
  EXPECT_EQ(alone.top_logprobs.front().size(), 2u);
  EXPECT_GE(alone.top_logprobs.front()[0].second, alone.logprobs.front());
}

TEST(Generate, PagedContiguousChunkedAndPreemptedRunsGiveTheSameTokens) {
  CausalLM model = model_of(tiny("llama"));
  const std::vector<std::vector<int64_t>> prompts = {tokens(9, 1), tokens(3, 2), tokens(12, 3),
                                                     tokens(5, 4)};
  for (const GenerateOptions& o : {greedy(20), sampled(3)}) {
    const auto want = generate(model, prompts, o);
    EngineOptions contiguous;
    contiguous.paged = false;
    EngineOptions chunked;  // prompts prefilled 2 tokens at a time beside the decodes
    chunked.max_num_seqs = 2;
    chunked.max_num_batched_tokens = 4;
    EngineOptions tight;  // 10 pages of 4 tokens: the running sequences outgrow them
    tight.max_sequence_length = 40;
    tight.page_size = 4;
    tight.kv_cache_bytes = 10 * 4 * (2 * 2 * 2 * 4 * 4);  // pages x tokens x bytes per token
    for (const EngineOptions& e : {contiguous, chunked, tight}) {
      const auto got = generate(model, prompts, o, e);
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(got[i].tokens, want[i].tokens) << "prompt " << i;
      }
    }
    Engine engine(model, tight);
    for (const auto& p : prompts) engine.add(p, o);
    while (!engine.idle()) engine.step();
    EXPECT_GT(engine.stats().preemptions, 0);
    EXPECT_EQ(engine.stats().blocks_used, 0);
  }
}

TEST(Generate, StopTokensCancellationAndBadRequestsAreNamed) {
  CausalLM model = model_of(tiny("llama"));
  const auto free_run = generate(model, {tokens(4, 1)}, greedy(10))[0];
  GenerateOptions o = greedy(10);
  o.stop_token_ids = {free_run.tokens[3]};
  const auto stopped = generate(model, {tokens(4, 1)}, o)[0];
  EXPECT_EQ(stopped.finish_reason, "stop");
  EXPECT_EQ(stopped.tokens.back(), free_run.tokens[3]);
  EXPECT_LE(stopped.tokens.size(), 4u);

  Engine engine(model);
  const int64_t a = engine.add(tokens(4, 1), greedy(50));
  engine.step();
  EXPECT_GT(engine.stats().blocks_used, 0);
  engine.cancel(a);
  EXPECT_TRUE(engine.idle());
  EXPECT_EQ(engine.stats().blocks_used, 0);

  EXPECT_ERROR(engine.add({}, greedy(1)), "Engine::add: the prompt has no tokens");
  EXPECT_ERROR(engine.add({64}, greedy(1)), "prompt token 64 is outside the vocabulary of 64");
  EXPECT_ERROR(engine.add(tokens(64, 1), greedy(1)),
               "the prompt has 64 tokens; max_sequence_length 64 leaves no room");
  EXPECT_ERROR(engine.add({1}, greedy(0)), "max_tokens 0 must be >= 1");
  GenerateOptions bad = greedy(1);
  bad.sampling.top_p = 0;
  EXPECT_ERROR(engine.add({1}, bad), "sampling.top_p 0 must be in (0, 1]");
  bad = greedy(1);
  bad.top_logprobs = 21;
  EXPECT_ERROR(engine.add({1}, bad), "top_logprobs 21 must be in [0, 20]");
  EXPECT_TRUE(engine.idle());
  EngineOptions small;
  small.kv_cache_bytes = 1000;
  EXPECT_ERROR((Engine{model, small}), "less than one sequence of max_sequence_length 64");
  model->train();
  EXPECT_ERROR(Engine{model}, "the model is in training mode; call eval() first");
}

// ---- stop strings, found by the engine --------------------------------------------------------

// Token i decodes to one letter, so text offsets are token counts.
class LetterDecoder : public te::gen::Detokenizer {
 public:
  std::string decode(const std::vector<int64_t>& ids, bool) const override {
    std::string out;
    for (int64_t id : ids) out += static_cast<char>('a' + id % 26);
    return out;
  }
};

EngineOptions with_letters(EngineOptions o = {}) {
  o.tokenizer = std::make_shared<const LetterDecoder>();
  return o;
}

TEST(Generate, StopStringsEndTheRequestInTheStepThatCompletesThem) {
  CausalLM model = model_of(tiny("llama"));
  const Generated free_run = generate(model, {tokens(4, 1)}, greedy(20), with_letters())[0];
  ASSERT_EQ(free_run.text.size(), 20u);
  EXPECT_EQ(free_run.finish_reason, "length");
  const std::string stop = free_run.text.substr(6, 2);
  const std::size_t at = free_run.text.find(stop);
  GenerateOptions o = greedy(20);
  o.stop = {"never", stop};
  Engine engine(model, with_letters());
  const int64_t id = engine.add(tokens(4, 1), o);
  std::string text, finish;
  int64_t generated = 0;
  while (!engine.idle()) {
    for (const TokenEvent& e : engine.step()) {
      ASSERT_EQ(e.request, id);
      ASSERT_TRUE(finish.empty()) << "a token after the stop string";
      ++generated;
      text += e.text;
      finish = e.finish_reason;
    }
  }
  // The token that completes the stop string is the last: no step decoded past it, nothing left
  // in the cache, and the text ends before the stop string.
  EXPECT_EQ(finish, "stop");
  EXPECT_EQ(generated, static_cast<int64_t>(at + stop.size()));
  EXPECT_EQ(text, free_run.text.substr(0, at));
  EXPECT_EQ(engine.stats().blocks_used, 0);
  // A stop token's own text is not returned either.
  GenerateOptions by_token = greedy(20);
  by_token.stop_token_ids = {free_run.tokens[5]};
  const Generated stopped = generate(model, {tokens(4, 1)}, by_token, with_letters())[0];
  EXPECT_EQ(stopped.finish_reason, "stop");
  EXPECT_EQ(stopped.text, free_run.text.substr(0, stopped.tokens.size() - 1));
  // Refused by name: stop strings without a tokenizer, an empty one.
  Engine plain(model);
  EXPECT_ERROR(plain.add(tokens(4, 1), o),
               "the request has stop strings but the Engine has no tokenizer");
  o.stop = {""};
  EXPECT_ERROR(engine.add(tokens(4, 1), o), "Engine::add: stop[0] is an empty string");
}

// ---- the sampler ------------------------------------------------------------------------------

TEST(Sampler, FiltersAsTransformersProcessorsDo) {
  const at::Tensor logits = at::tensor({2.0f, 1.0f, 1.0f, 0.0f, -1.0f});
  SamplingOptions o;
  o.top_k = 2;  // the k-th value's ties are kept
  at::Tensor p = Sampler(o).distribution(logits, {});
  EXPECT_EQ(p.nonzero().numel(), 3);
  o = SamplingOptions();
  o.top_p = 0.5;  // 2.0 alone holds ~0.53 of the mass
  p = Sampler(o).distribution(logits, {});
  EXPECT_TRUE(at::equal(p, at::tensor({1.0f, 0.0f, 0.0f, 0.0f, 0.0f})));
  o = SamplingOptions();
  o.min_p = 0.3;  // e^-1 = 0.37 of the top survives, e^-2 does not
  p = Sampler(o).distribution(logits, {});
  EXPECT_EQ(p.nonzero().numel(), 3);
  o = SamplingOptions();
  o.repetition_penalty = 2;
  o.temperature = 0;  // greedy after the penalty: 2.0 -> 1.0, ties go to the lowest id
  EXPECT_EQ(Sampler(o).next(logits, {0}), 0);
  EXPECT_EQ(Sampler(o).next(at::tensor({2.0f, 1.5f}), {0}), 1);
  EXPECT_NEAR(Sampler(SamplingOptions()).distribution(logits, {}).sum().item<float>(), 1, 1e-6);
  o = SamplingOptions();
  o.temperature = -1;
  EXPECT_ERROR(Sampler{o}, "sampling.temperature -1 must be >= 0");
  o = SamplingOptions();
  o.repetition_penalty = 0;
  EXPECT_ERROR(Sampler{o}, "sampling.repetition_penalty 0 must be > 0");
}

// OpenAI's presence and frequency penalties count the generated tokens only (vLLM's
// apply_penalties): a prompt token is left alone; a generated one loses presence_penalty once
// and frequency_penalty per occurrence, before the temperature.
TEST(Sampler, PresenceAndFrequencyPenaltiesCountGeneratedTokens) {
  const at::Tensor logits = at::tensor({2.0f, 1.0f, 1.0f, 0.0f, -1.0f});
  SamplingOptions o;
  o.presence_penalty = 0.5;
  o.frequency_penalty = 0.25;
  o.temperature = 0.5;
  // Prompt {1}, then generated 0, 0, 3.
  const at::Tensor p = Sampler(o).distribution(logits, {1, 0, 0, 3}, 1);
  const at::Tensor want = (at::tensor({1.0f, 1.0f, 1.0f, -0.75f, -1.0f}) / 0.5).softmax(0);
  EXPECT_TRUE(at::allclose(p, want, 1e-6, 1e-7)) << p << want;
  // Nothing generated yet: no penalty, whatever the prompt holds.
  EXPECT_TRUE(at::allclose(Sampler(o).distribution(logits, {0, 0, 3}, 3), (logits / 0.5).softmax(0),
                           1e-6, 1e-7));
  // Greedy picks after the penalties; a negative penalty favours what was generated.
  o.temperature = 0;
  o.frequency_penalty = 0;
  o.presence_penalty = 2;
  EXPECT_EQ(Sampler(o).next(at::tensor({2.0f, 1.5f}), {0}, 0), 1);
  EXPECT_EQ(Sampler(o).next(at::tensor({2.0f, 1.5f}), {0}, 1), 0);  // 0 is the prompt's
  o.presence_penalty = -1;
  EXPECT_EQ(Sampler(o).next(at::tensor({1.0f, 1.5f}), {0}, 0), 0);
  o.presence_penalty = 2.5;
  EXPECT_ERROR(Sampler{o}, "sampling.presence_penalty 2.5 must be in [-2, 2]");
  o.presence_penalty = 0;
  o.frequency_penalty = -3;
  EXPECT_ERROR(Sampler{o}, "sampling.frequency_penalty -3 must be in [-2, 2]");
}

// ---- text as it is generated ------------------------------------------------------------------

// A byte-level BPE tokenizer of single characters: 'Ã' and '©' are the bytes 0xC3 0xA9 of "é".
Tokenizer byte_tokenizer() {
  const json j = te::test::byte_level_bpe_json(
      {"<|end|>", "h", "i", "!", "\u00c3", "\u00a9", "\u0120"}, {}, "<|end|>", 0);
  return Tokenizer::from_json(j.dump(), "tokenizer.json");
}

TEST(TextStream, HoldsBackHalfCharactersAndStopStringPrefixes) {
  const Tokenizer tok = byte_tokenizer();
  TextStream plain(tok);
  EXPECT_EQ(plain.push(1), "h");
  EXPECT_EQ(plain.push(4), "");  // 0xC3: half of "é"
  EXPECT_EQ(plain.push(5), "\u00e9");
  EXPECT_EQ(plain.push(0), "");  // a special token decodes to nothing
  EXPECT_EQ(plain.finish(), "");
  EXPECT_EQ(plain.text(), "h\u00e9");

  TextStream stopping(tok, {"i!", "zz"});
  EXPECT_EQ(stopping.push(1), "h");
  EXPECT_EQ(stopping.push(2), "");   // "i" may begin "i!"
  EXPECT_EQ(stopping.push(2), "i");  // "ii": the first i cannot
  EXPECT_FALSE(stopping.stopped());
  EXPECT_EQ(stopping.push(3), "");  // "i!": stop; the text ends before it
  EXPECT_TRUE(stopping.stopped());
  EXPECT_EQ(stopping.push(1), "");
  EXPECT_EQ(stopping.finish(), "");
  EXPECT_EQ(stopping.text(), "hi");

  TextStream ended(tok, {"i!"});
  ended.push(1);
  ended.push(2);
  EXPECT_EQ(ended.finish(), "i");  // generation ended: what was held back is final
  EXPECT_EQ(ended.text(), "hi");
  EXPECT_ERROR(TextStream(tok, {""}), "TextStream: a stop string is empty");
}

// A decoder as SentencePiece's: pieces joined, the first one's leading space dropped; it
// records the longest run of ids it was asked to decode.
class LeadingSpaceDecoder : public te::gen::Detokenizer {
 public:
  std::string decode(const std::vector<int64_t>& ids, bool) const override {
    longest = std::max(longest, ids.size());
    static const char* const pieces[] = {" a", "b", " c", "\u00e9"};
    std::string s;
    for (const int64_t id : ids) s += pieces[id];
    return s.rfind(' ', 0) == 0 ? s.substr(1) : s;
  }
  mutable std::size_t longest = 0;
};

// Long streams: what push and finish return is the whole text's decode, piece by piece, while
// each token decodes only itself and a few before it.
TEST(TextStream, LongStreamsEqualTheWholeDecodeAndDecodeOnlyTheirTail) {
  std::mt19937 random(7);
  for (int run = 0; run < 20; ++run) {
    std::vector<int64_t> ids(300);
    for (int64_t& id : ids) id = static_cast<int64_t>(random() % 4);
    auto decoder = std::make_shared<LeadingSpaceDecoder>();
    TextStream stream(std::shared_ptr<const te::gen::Detokenizer>(decoder), {"zz"});
    std::string streamed;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      streamed += stream.push(ids[i]);
      if (i == 20) decoder->longest = 0;
    }
    EXPECT_LE(decoder->longest, 5u) << "run " << run;  // 4 settled ids and the new one
    streamed += stream.finish();
    EXPECT_EQ(streamed, decoder->decode(ids, true)) << "run " << run;
    decoder->longest = 0;
  }
  // Byte-level BPE with half characters (0xC3 then 0xA9 is "é"; either alone is U+FFFD).
  const Tokenizer tok = byte_tokenizer();
  for (int run = 0; run < 20; ++run) {
    std::vector<int64_t> ids(200);
    for (int64_t& id : ids) id = 1 + static_cast<int64_t>(random() % 6);
    TextStream stream(tok, {"!!!", "\u00e9i"});
    std::string streamed;
    for (const int64_t id : ids) streamed += stream.push(id);
    streamed += stream.finish();
    const std::string whole = tok.decode(ids, true);
    const std::size_t stop = std::min(whole.find("!!!"), whole.find("\u00e9i"));
    EXPECT_EQ(streamed, whole.substr(0, stop)) << "run " << run;
    EXPECT_EQ(stream.stopped(), stop != std::string::npos);
  }
}

TEST(ChatTemplate, AppliesTheFamiliesItKnowsAndRefusesOthersByName) {
  const ChatTemplate chatml = ChatTemplate::recognise(
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\nBe kind.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + "
      "message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
      "model.gguf");
  EXPECT_EQ(chatml.family(), "chatml");
  EXPECT_EQ(chatml.apply({{"user", "Hi"}}),
            "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(chatml.apply({{"system", "S"}, {"user", "Hi"}}, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_ERROR(chatml.apply({{"tool", "x"}}), "role 'tool' is not system, user or assistant");
  EXPECT_ERROR(chatml.apply({}), "chat template: no messages");
  // Phi-3.5-mini-instruct's (llama.cpp's models/templates/microsoft-Phi-3.5-mini-instruct.jinja).
  const ChatTemplate phi3 = ChatTemplate::recognise(
      "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
      "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
      "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == "
      "'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}"
      "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}"
      "{{ eos_token }}{% endif %}",
      "Phi-3.5");
  EXPECT_EQ(phi3.family(), "phi3");
  EXPECT_EQ(phi3.apply({{"system", "S"}, {"user", "Hi"}, {"assistant", "Yo"}, {"user", "?"}}),
            "<|system|>\nS<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nYo<|end|>\n<|user|>\n?"
            "<|end|>\n<|assistant|>\n");
  EXPECT_EQ(phi3.apply({{"system", ""}, {"user", "Hi"}}), "<|user|>\nHi<|end|>\n<|assistant|>\n");
  EXPECT_ERROR(phi3.apply({{"user", "Hi"}}, false), "ends with the tokenizer's eos_token");
  // The first Phi-3 templates fold the generation prompt into each user turn: not this family.
  EXPECT_ERROR(ChatTemplate::recognise(
                   "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') "
                   "%}{{'<|user|>' + '\n' + message['content'] + '<|end|>' + '\n' + "
                   "'<|assistant|>' + '\n'}}{% elif (message['role'] == 'assistant') %}"
                   "{{message['content'] + '<|end|>' + '\n'}}{% endif %}{% endfor %}",
                   "Phi-3-mini"),
               "chat template of Phi-3-mini is not one te-cpp applies");
  // Gemma's (the parts recognised; the whole templates are held to apply_chat_template by
  // tests/interop/check_generate.py), rendered as transformers renders them.
  const ChatTemplate gemma2 = ChatTemplate::recognise(
      "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role "
      "not supported') }}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | "
      "trim + '<end_of_turn>\n' }}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}",
      "gemma-2/tokenizer_config.json");
  EXPECT_EQ(gemma2.family(), "gemma");
  const std::vector<te::gen::ChatMessage> turns = {
      {"user", " Hi there\n"}, {"assistant", "Hello!"}, {"user", "2+2?"}};
  EXPECT_EQ(gemma2.apply(turns),
            "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\nHello!"
            "<end_of_turn>\n<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_ERROR(gemma2.apply({{"system", "S"}, {"user", "Hi"}}),
               "chat template (gemma): this template takes no system message");
  EXPECT_ERROR(gemma2.apply({{"user", "a"}, {"user", "b"}}),
               "message 1 is 'user' but the roles must alternate user/assistant/");
  const ChatTemplate gemma3 = ChatTemplate::recognise(
      "{{ bos_token }}{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
      "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}"
      "{{ '<end_of_turn>\n' }}{%- if add_generation_prompt -%}",
      "gemma-3/tokenizer_config.json");
  EXPECT_EQ(gemma3.apply({{"system", " Be brief. "}, {"user", "Hi\n"}}),
            "<bos><start_of_turn>user\n Be brief. \n\nHi<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(gemma3.apply(turns), gemma2.apply(turns));
  EXPECT_ERROR(
      ChatTemplate::recognise("{{ bos_token }}{% for m in messages %}[INST] {{ m.content }}"
                              " [/INST]{% endfor %}",
                              "mistral/tokenizer_config.json"),
      "chat template of mistral/tokenizer_config.json is not one te-cpp applies");
}

// ---- on a mesh ------------------------------------------------------------------------------

// `whole`'s weights in a model built under the mesh and rules in scope (each rank keeping its
// slices), in eval mode.
CausalLM laid_out_copy(const CausalLM& whole) {
  CausalLM model(whole->config);
  for (const auto& p : whole->named_parameters()) {
    te::nn::set_parameter_from_global(*model, p.key(), p.value().detach());
  }
  model->eval();
  return model;
}

// ---- the model's sampling defaults ------------------------------------------------------------

// A GGUF file of metadata only: (key, value) pairs, a float (f32) or an integer (i32) each.
void write_gguf_metadata(
    const std::string& path,
    const std::vector<std::pair<std::string, std::variant<float, int32_t>>>& kv) {
  std::ofstream out(path, std::ios::binary);
  auto put = [&](const auto& v) { out.write(reinterpret_cast<const char*>(&v), sizeof v); };
  out.write("GGUF", 4);
  put(uint32_t{3});
  put(uint64_t{0});  // tensors
  put(static_cast<uint64_t>(kv.size()));
  for (const auto& [key, value] : kv) {
    put(static_cast<uint64_t>(key.size()));
    out.write(key.data(), static_cast<std::streamsize>(key.size()));
    if (const float* f = std::get_if<float>(&value)) {
      put(uint32_t{6});
      put(*f);
    } else {
      put(uint32_t{5});
      put(std::get<int32_t>(value));
    }
  }
}

// Each sampling field the model's file sets (generation_config.json as transformers reads it;
// llama.cpp's general.sampling.* GGUF keys), the others llama.cpp's (common/common.h).
TEST(GenerationDefaults, SamplingFromTheModelsFileElseLlamaCpps) {
  te::test::TempDir dir("te_gen_defaults");
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
  };
  GenerationDefaults d = read_generation_defaults(dir.path().string());  // no file at all
  EXPECT_EQ(describe_sampling(d),
            "temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repetition_penalty 1 "
            "(llama.cpp's defaults)");
  write("generation_config.json",
        R"({"do_sample": true, "temperature": 0.6, "top_p": 0.9, "top_k": null,
            "eos_token_id": [1, 2]})");
  d = read_generation_defaults(dir.path().string());
  EXPECT_EQ(d.sampling.temperature, 0.6);
  EXPECT_EQ(d.sampling.top_p, 0.9);
  EXPECT_EQ(d.sampling.top_k, 40);
  EXPECT_EQ(d.eos_token_ids, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(describe_sampling(d),
            "top_k 40, min_p 0.05, repetition_penalty 1 (llama.cpp's defaults); temperature 0.6, "
            "top_p 0.9 (generation_config.json)");
  // transformers draws only with do_sample true: false is greedy.
  write("generation_config.json", R"({"do_sample": false, "temperature": 0.6})");
  d = read_generation_defaults(dir.path().string());
  EXPECT_EQ(d.sampling.temperature, 0);
  EXPECT_NE(describe_sampling(d).find("temperature 0 (generation_config.json: do_sample false)"),
            std::string::npos)
      << describe_sampling(d);
  write("generation_config.json", R"({"top_p": 0})");
  EXPECT_ERROR(read_generation_defaults(dir.path().string()),
               "generation_config.json'.top_p 0 must be in (0, 1]");
  write("generation_config.json", R"({"temperature": "warm"})");
  EXPECT_ERROR(read_generation_defaults(dir.path().string()),
               "generation_config.json': temperature is not a number");

  const std::string gguf = (dir / "model.gguf").string();
  write_gguf_metadata(gguf, {{"general.sampling.temp", 0.3f}, {"general.sampling.top_k", 20}});
  d = read_generation_defaults(gguf);
  EXPECT_FLOAT_EQ(static_cast<float>(d.sampling.temperature), 0.3f);
  EXPECT_EQ(d.sampling.top_k, 20);
  EXPECT_EQ(d.sampling.top_p, 0.95);
  EXPECT_EQ(describe_sampling(d),
            "top_p 0.95, min_p 0.05, repetition_penalty 1 (llama.cpp's defaults); temperature "
            "0.3 (general.sampling.temp); top_k 20 (general.sampling.top_k)");
  write_gguf_metadata(gguf, {{"general.sampling.top_k", -1}});  // llama.cpp: <= 0 is off
  EXPECT_EQ(read_generation_defaults(gguf).sampling.top_k, 0);
  write_gguf_metadata(gguf, {{"general.sampling.min_p", 1.5f}});
  EXPECT_ERROR(read_generation_defaults(gguf), "general.sampling.min_p 1.5 must be in [0, 1]");
}

TEST(Generate, TensorParallelEqualsOneProcess) {
  CausalLM whole = model_of(tiny("llama"));
  const std::vector<std::vector<int64_t>> prompts = {tokens(9, 1), tokens(4, 2)};
  const auto want_greedy = generate(whole, prompts, greedy(12));
  const auto want_sampled = generate(whole, prompts, sampled(9));
  std::mutex mutex;
  run_local_ranks(2, [&](int rank) {
    DeviceMesh mesh({2}, {"tp"});
    MeshScope on(mesh);
    MeshResource r;
    r.tp = "tp";
    MeshResourceScope resource(r);
    AxisRulesScope rules(extend_logical_axis_rules(parse_axis_rules("vocab=tp")));
    CausalLM model = laid_out_copy(whole);
    const auto greedy_tokens = generate(model, prompts, greedy(12));
    const auto sampled_tokens = generate(model, prompts, sampled(9));
    std::lock_guard<std::mutex> lock(mutex);
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(greedy_tokens[i].tokens, want_greedy[i].tokens) << "rank " << rank;
      EXPECT_EQ(sampled_tokens[i].tokens, want_sampled[i].tokens) << "rank " << rank;
    }
  });
}

// DP2 x TP2: the requests spread over the two data-parallel groups, each decoding its own on
// its tensor-parallel row; every rank returns every request's tokens, equal to one process's.
TEST(Generate, DataAndTensorParallelEqualsOneProcess) {
  CausalLM whole = model_of(tiny("llama"));
  const std::vector<std::vector<int64_t>> prompts = {tokens(9, 1), tokens(4, 2), tokens(6, 3),
                                                     tokens(2, 4), tokens(11, 5)};
  GenerateOptions logprobs = greedy(10);
  logprobs.top_logprobs = 3;
  const auto want_greedy = generate(whole, prompts, logprobs);
  const auto want_sampled = generate(whole, prompts, sampled(9));
  std::mutex mutex;
  run_local_ranks(4, [&](int rank) {
    DeviceMesh mesh({2, 2}, {"data", "tp"});
    MeshScope on(mesh);
    MeshResource r;
    r.dp = "data";
    r.tp = "tp";
    MeshResourceScope resource(r);
    AxisRulesScope rules(extend_logical_axis_rules(parse_axis_rules("vocab=tp")));
    CausalLM model = laid_out_copy(whole);
    // Requests 0, 2, 4 go to group 0 and 1, 3 to group 1 (the fewest live ones, ties lowest);
    // each group's cache holds its own only.
    EngineOptions options;
    Engine engine(model, options);
    for (const auto& prompt : prompts) engine.add(prompt, logprobs);
    engine.step();  // both groups prefill theirs
    EXPECT_EQ(engine.stats().running, 5) << "rank " << rank;
    EXPECT_EQ(engine.cache().sequence_ids().size(), rank < 2 ? 3u : 2u) << "rank " << rank;
    const auto greedy_tokens = generate(model, prompts, logprobs);
    const auto sampled_tokens = generate(model, prompts, sampled(9));
    std::lock_guard<std::mutex> lock(mutex);
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(greedy_tokens[i].tokens, want_greedy[i].tokens) << "rank " << rank << " #" << i;
      EXPECT_EQ(greedy_tokens[i].finish_reason, want_greedy[i].finish_reason) << "rank " << rank;
      for (std::size_t t = 0; t < want_greedy[i].tokens.size(); ++t) {
        EXPECT_NEAR(greedy_tokens[i].logprobs[t], want_greedy[i].logprobs[t], 1e-4);
        ASSERT_EQ(greedy_tokens[i].top_logprobs[t].size(), 3u);
        EXPECT_EQ(greedy_tokens[i].top_logprobs[t][0].first,
                  want_greedy[i].top_logprobs[t][0].first);
      }
      EXPECT_EQ(sampled_tokens[i].tokens, want_sampled[i].tokens) << "rank " << rank << " #" << i;
    }
  });
}

TEST(Generate, DataParallelRefusesWeightsShardedAlongTheDataAxis) {
  CausalLM whole = model_of(tiny("llama"));
  run_local_ranks(2, [&](int) {
    DeviceMesh mesh({2}, {"data"});
    MeshScope on(mesh);
    MeshResource r;
    r.fsdp = "data";
    MeshResourceScope resource(r);
    AxisRulesScope rules(extend_logical_axis_rules({}));
    CausalLM model = laid_out_copy(whole);
    EXPECT_ERROR(Engine{model}, "is sharded along mesh axis 'data', the data axis");
  });
}

// DP2: the group that decodes a request finds its stop strings; every rank gets its text.
TEST(Generate, DataParallelStopStringsEqualOneProcess) {
  CausalLM whole = model_of(tiny("llama"));
  const std::vector<std::vector<int64_t>> prompts = {tokens(9, 1), tokens(4, 2), tokens(6, 3)};
  const auto free_runs = generate(whole, prompts, greedy(16), with_letters());
  GenerateOptions o = greedy(16);
  for (const Generated& g : free_runs) o.stop.push_back(g.text.substr(5, 3));
  const auto want = generate(whole, prompts, o, with_letters());
  std::mutex mutex;
  run_local_ranks(2, [&](int rank) {
    DeviceMesh mesh({2}, {"data"});
    MeshScope on(mesh);
    MeshResource r;
    r.dp = "data";
    MeshResourceScope resource(r);
    AxisRulesScope rules(extend_logical_axis_rules({}));
    CausalLM model = laid_out_copy(whole);
    Engine engine(model, with_letters());
    ASSERT_EQ(engine.data_parallel_size(), 2);
    const auto got = generate(model, prompts, o, with_letters());
    std::lock_guard<std::mutex> lock(mutex);
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "rank " << rank << " #" << i;
      EXPECT_EQ(got[i].text, want[i].text) << "rank " << rank << " #" << i;
      EXPECT_EQ(got[i].finish_reason, "stop") << "rank " << rank << " #" << i;
    }
  });
}

}  // namespace
}  // namespace te::hf
