// te::hf: config.json read strictly (every field honoured or refused by name), checkpoints
// loaded whole, from a sharded set, and onto two tensor-parallel ranks that each read about half
// the bytes and together equal one process; a calibrated model served from FP8 weights; every bad
// file named. (tests/interop/check_hf_models.py holds the numbers to transformers.)

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>

#include "../expect_error.h"
#include "../temp_dir.h"
#include "te/distributed.h"
#include "te/fp8.h"
#include "te/hf/causal_lm.h"
#include "te/hf/families.h"
#include "te/hf/gguf.h"
#include "te/hf/tokenizer.h"
#include "te/nn/checkpoint.h"
#include "te/nn/inference.h"
#include "te/nn/init.h"
#include "te/nn/safetensors.h"
#include "te/nn/sharded.h"

namespace te::hf {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

json tiny_config(const std::string& type = "llama") {
  json c = {{"model_type", type},
            {"architectures",
             {type == "llama"     ? "LlamaForCausalLM"
              : type == "mistral" ? "MistralForCausalLM"
              : type == "qwen2"   ? "Qwen2ForCausalLM"
                                  : "Qwen3ForCausalLM"}},
            {"vocab_size", 64},
            {"hidden_size", 16},
            {"intermediate_size", 24},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"max_position_embeddings", 32},
            {"rms_norm_eps", 1e-5},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", false},
            {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
            {"dtype", "float32"},
            {"transformers_version", "5.23.0"}};
  return c;
}

CausalLMConfig parse(const json& j) { return parse_causal_lm_config(j.dump(), "config.json"); }

// Every te parameter, whole (one process).
std::map<std::string, at::Tensor> params_of(const CausalLM& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model->named_parameters()) out[p.key()] = p.value().detach();
  return out;
}

// A random model of `config` saved as a Hugging Face directory (config.json and either one
// model.safetensors or two files with an index).
CausalLM save_random(const fs::path& dir, const json& config, bool two_files = false) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump(2);
  te::nn::manual_seed(5);
  CausalLM model(parse(config));
  const auto hf = to_hf_tensors(model->config, params_of(model));
  if (!two_files) {
    te::nn::write_safetensors((dir / "model.safetensors").string(), hf);
    return model;
  }
  std::map<std::string, at::Tensor> a, b;
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  for (const auto& [name, t] : hf) {
    const bool first = name.find("layers.1.") == std::string::npos;
    (first ? a : b)[name] = t;
    index["weight_map"][name] =
        first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  te::nn::write_safetensors((dir / "model-00001-of-00002.safetensors").string(), a);
  te::nn::write_safetensors((dir / "model-00002-of-00002.safetensors").string(), b);
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  return model;
}

at::Tensor ids() { return at::arange(2 * 7, at::kLong).view({2, 7}).mul(5).remainder(64); }

TEST(HfConfig, ReadsTheLlamaFamilysFields) {
  json j = tiny_config("mistral");
  j["sliding_window"] = 4;
  const CausalLMConfig m = parse(j);
  EXPECT_EQ(m.head_dim, 4);
  EXPECT_EQ(m.num_key_value_heads, 2);
  EXPECT_EQ(m.layer_windows, (std::vector<std::optional<int64_t>>{4, 4}));
  EXPECT_FALSE(m.qkv_bias);

  json q = tiny_config("qwen2");
  q["use_sliding_window"] = true;
  q["sliding_window"] = 8;
  q["max_window_layers"] = 1;  // before transformers 5: layers from this one on slide
  const CausalLMConfig q2 = parse(q);
  EXPECT_EQ(q2.layer_windows, (std::vector<std::optional<int64_t>>{std::nullopt, 8}));
  EXPECT_TRUE(q2.qkv_bias);
  q["layer_types"] = {"sliding_attention", "full_attention"};
  EXPECT_EQ(parse(q).layer_windows, (std::vector<std::optional<int64_t>>{8, std::nullopt}));
  q["use_sliding_window"] = false;  // then the window is off whatever else says
  q.erase("layer_types");
  EXPECT_EQ(parse(q).layer_windows,
            (std::vector<std::optional<int64_t>>{std::nullopt, std::nullopt}));

  json old = tiny_config("qwen3");
  old.erase("rope_parameters");
  old["rope_theta"] = 500.0;
  old["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  old["head_dim"] = 8;
  const CausalLMConfig q3 = parse(old);
  EXPECT_EQ(q3.rope_theta, 500.0);
  EXPECT_EQ(q3.rope_type, "linear");
  EXPECT_EQ(q3.rope_factor, 4.0);
  EXPECT_EQ(q3.head_dim, 8);
  EXPECT_TRUE(q3.qk_norm);
  // transformers 4 saved rope_scaling with both "type" and "rope_type"; equal, they are one.
  old["rope_scaling"]["rope_type"] = "linear";
  EXPECT_EQ(parse(old).rope_type, "linear");
  old["partial_rotary_factor"] = 0.5;  // int(8 * 0.5) rotary dims, as transformers computes
  EXPECT_EQ(parse(old).rotary_dim, 4);
  // Mistral without the field: transformers' default window, 4096; null: none.
  json mistral = tiny_config("mistral");
  EXPECT_EQ(parse(mistral).layer_windows, (std::vector<std::optional<int64_t>>{4096, 4096}));
  mistral["sliding_window"] = nullptr;
  EXPECT_EQ(parse(mistral).layer_windows,
            (std::vector<std::optional<int64_t>>{std::nullopt, std::nullopt}));
}

// Llama 3.1's rope_parameters: per-frequency factors as transformers' _compute_llama3_parameters
// scales them (head_dim 4 at theta 1e4: wavelengths 6.28 and 628, against original / high = 8
// and original / low = 32), the required fields named when one is missing.
// Gemma 2 (transformers 5.23.0 models/gemma2/configuration_gemma2.py): Gemma2Config's defaults
// for what config.json leaves out, hidden_act (which Gemma2Config has not) taken as metadata, and
// what te-cpp does not build refused by name.
TEST(HfConfig, ReadsGemma2sFieldsAndDefaults) {
  json j = tiny_config();
  j["model_type"] = "gemma2";
  j["architectures"] = {"Gemma2ForCausalLM"};
  j.erase("tie_word_embeddings");
  j["hidden_act"] = "gelu_pytorch_tanh";  // real Gemma 2 configs carry both
  j["hidden_activation"] = "gelu_pytorch_tanh";
  j["cache_implementation"] = "hybrid";
  CausalLMConfig c = parse(j);
  EXPECT_EQ(c.head_dim, 256);  // Gemma2Config's default, not hidden_size / heads
  EXPECT_TRUE(c.tie_word_embeddings && c.zero_centered_norms && c.post_block_norms);
  EXPECT_EQ(c.pad_token_id, std::optional<int64_t>(0));
  EXPECT_EQ(c.mlp_activations, (std::vector<std::string>{"gelu", "linear"}));
  EXPECT_DOUBLE_EQ(c.embedding_multiplier, 4.0);  // sqrt(16)
  EXPECT_DOUBLE_EQ(c.attention_scale, 1.0 / 16);  // 256^-0.5
  EXPECT_EQ(c.attn_logit_softcapping, 50.0);
  EXPECT_EQ(c.final_logit_softcapping, 30.0);
  ASSERT_EQ(c.layer_windows.size(), 2u);  // sliding where (i + 1) % 2, 4096 keys
  EXPECT_EQ(c.layer_windows[0], std::optional<int64_t>(4096));
  EXPECT_EQ(c.layer_windows[1], std::nullopt);
  j["head_dim"] = 8;
  j["query_pre_attn_scalar"] = 64;
  j["attn_logit_softcapping"] = nullptr;
  j["final_logit_softcapping"] = 5.0;
  j["sliding_window"] = 3;
  j["layer_types"] = {"full_attention", "sliding_attention"};
  j["pad_token_id"] = nullptr;
  c = parse(j);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_DOUBLE_EQ(c.attention_scale, 0.125);
  EXPECT_EQ(c.attn_logit_softcapping, 0.0);
  EXPECT_EQ(c.final_logit_softcapping, 5.0);
  EXPECT_EQ(c.layer_windows[0], std::nullopt);
  EXPECT_EQ(c.layer_windows[1], std::optional<int64_t>(3));
  EXPECT_EQ(c.pad_token_id, std::nullopt);
  json bad = j;
  bad["hidden_activation"] = "silu";  // a SwiGLU Gemma: te builds it, as transformers would
  EXPECT_EQ(parse(bad).mlp_activations, (std::vector<std::string>{"silu", "linear"}));
  bad["hidden_activation"] = "gelu";
  EXPECT_ERROR(parse(bad), "hidden_activation: 'gelu': te-cpp builds this family's gated MLP");
  bad = j;
  bad["use_bidirectional_attention"] = true;
  EXPECT_ERROR(parse(bad), "use_bidirectional_attention: te-cpp builds Gemma causal");
  bad = j;
  bad["attn_logit_softcapping"] = 0;
  EXPECT_ERROR(parse(bad), "attn_logit_softcapping: must be positive and finite, or null");
  bad = j;
  bad["query_pre_attn_scalar"] = -1;
  EXPECT_ERROR(parse(bad), "query_pre_attn_scalar: must be positive and finite");
  bad = j;
  bad["sliding_window"] = nullptr;
  EXPECT_ERROR(parse(bad), "sliding_window: is null but layer 1 slides");
  bad = j;
  bad["layer_types"] = {"full_attention", "chunked_attention"};
  EXPECT_ERROR(parse(bad), "layer_types: entry \"chunked_attention\" is not full_attention");
  bad = j;
  bad["partial_rotary_factor"] = 0.5;
  EXPECT_ERROR(parse(bad), "partial_rotary_factor: Gemma's rotary embedding rotates whole heads");
  bad = j;
  bad["sliding_window_pattern"] = 6;  // Gemma 3's, not Gemma 2's
  EXPECT_ERROR(parse(bad), "sliding_window_pattern: is not a field te-cpp honours");
}

// Gemma 3 (transformers 5.23.0 models/gemma3/configuration_gemma3.py): Gemma3TextConfig's
// defaults, its two RoPEs in transformers 5's per-layer-type form or the older rope_theta,
// rope_local_base_freq and rope_scaling, and the attention soft cap transformers never applies
// refused.
// Gemma 1 (transformers 5.23.0 models/gemma/configuration_gemma.py): GemmaConfig's defaults,
// its "gelu" read as the tanh form, hidden_activation (not GemmaConfig's field) read past.
TEST(HfConfig, ReadsGemmasFields) {
  json j = tiny_config();
  j["model_type"] = "gemma";
  j["architectures"] = {"GemmaForCausalLM"};
  j["hidden_act"] = "gelu";
  j["hidden_activation"] = nullptr;
  j.erase("tie_word_embeddings");
  const CausalLMConfig c = parse(j);
  EXPECT_EQ(c.mlp_activations, (std::vector<std::string>{"gelu", "linear"}));
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_TRUE(c.zero_centered_norms && c.tie_word_embeddings);
  EXPECT_FALSE(c.post_block_norms || c.qk_norm);
  EXPECT_DOUBLE_EQ(c.embedding_multiplier, 4.0);
  EXPECT_EQ(c.attention_scale, 0.0);  // head_dim^-0.5
  EXPECT_EQ(c.layer_windows[0], std::nullopt);
  for (const char* field : {"sliding_window", "query_pre_attn_scalar", "final_logit_softcapping"}) {
    json bad = j;
    bad[field] = 4;
    EXPECT_ERROR(parse(bad), std::string(field) + ": is not a field te-cpp honours");
  }
}

TEST(HfConfig, ReadsGemma3sFieldsAndTwoRopes) {
  json j = tiny_config();
  j["model_type"] = "gemma3_text";
  j["architectures"] = {"Gemma3ForCausalLM"};
  j["num_hidden_layers"] = 7;
  j.erase("rope_parameters");
  j.erase("tie_word_embeddings");
  j["_sliding_window_pattern"] = 6;  // save_pretrained's, not read back
  CausalLMConfig c = parse(j);
  EXPECT_TRUE(c.qk_norm && c.zero_centered_norms && c.post_block_norms && c.tie_word_embeddings);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.sliding_rope_theta, 1e4);
  EXPECT_EQ(c.attn_logit_softcapping, 0.0);
  EXPECT_EQ(c.final_logit_softcapping, 0.0);
  for (int64_t i = 0; i < 7; ++i) {  // sliding_window_pattern 6: layer 5 is the global one
    EXPECT_EQ(c.layer_windows[static_cast<std::size_t>(i)].has_value(), i != 5) << i;
  }
  j["rope_theta"] = 5e5;  // the older fields, as real Gemma 3 configs have them
  j["rope_local_base_freq"] = 2e3;
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  j["sliding_window_pattern"] = 2;
  j["attn_logit_softcapping"] = nullptr;
  c = parse(j);
  EXPECT_EQ(c.rope_theta, 5e5);
  EXPECT_EQ(c.rope_type, "linear");
  EXPECT_EQ(c.rope_factor, 8.0);
  EXPECT_EQ(c.sliding_rope_theta, 2e3);
  EXPECT_FALSE(c.layer_windows[1].has_value());
  EXPECT_TRUE(c.layer_windows[2].has_value());
  json nested = tiny_config();
  nested["model_type"] = "gemma3_text";
  nested["architectures"] = {"Gemma3ForCausalLM"};
  nested["rope_parameters"] = {
      {"full_attention", {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 5000.0}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 100.0}}}};
  c = parse(nested);
  EXPECT_EQ(c.rope_theta, 5000.0);
  EXPECT_EQ(c.rope_factor, 2.0);
  EXPECT_EQ(c.sliding_rope_theta, 100.0);
  json bad = nested;
  bad["rope_parameters"]["sliding_attention"]["rope_type"] = "linear";
  EXPECT_ERROR(parse(bad), "rope_parameters.sliding_attention.rope_type: 'linear': te-cpp rotates");
  bad = nested;
  bad["rope_parameters"]["chunked_attention"] = json::object();
  EXPECT_ERROR(parse(bad), "rope_parameters.chunked_attention: expected full_attention and");
  bad = nested;
  bad["rope_local_base_freq"] = 50.0;
  EXPECT_ERROR(parse(bad), "rope_local_base_freq: differs from rope_parameters.sliding_attention");
  bad = nested;
  bad["attn_logit_softcapping"] = 50.0;
  EXPECT_ERROR(parse(bad), "attn_logit_softcapping: transformers 5.23.0's Gemma3Attention keeps");
  bad = nested;
  bad["sliding_window_pattern"] = 0;
  EXPECT_ERROR(parse(bad), "sliding_window_pattern: must be positive");
  // transformers always truncates YaRN in the per-layer-type form: false is refused, named where
  // it is.
  bad = nested;
  bad["rope_parameters"]["full_attention"] = {
      {"rope_type", "yarn"}, {"factor", 2.0}, {"truncate", false}};
  EXPECT_ERROR(parse(bad), "rope_parameters.full_attention.truncate: false is ignored by");
  // Gemma3TextConfig's max_position_embeddings where none is given.
  json unsized = nested;
  unsized.erase("max_position_embeddings");
  EXPECT_EQ(parse(unsized).max_position_embeddings, 131072);
  // Gemma 2 takes the flat RoPE only.
  bad = nested;
  bad["model_type"] = "gemma2";
  bad["architectures"] = {"Gemma2ForCausalLM"};
  EXPECT_ERROR(parse(bad), "rope_parameters.full_attention: is not a field te-cpp honours");
}

TEST(HfConfig, ReadsLlama3RopeScalingAsFrequencyFactors) {
  json j = tiny_config();
  j["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 1e4},
                          {"factor", 8.0},           {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 32}};
  const CausalLMConfig c = parse(j);
  EXPECT_EQ(c.rope_type, "llama3");
  EXPECT_EQ(c.rope_freq_factors, (std::vector<double>{1.0, 8.0}));
  j["rope_parameters"]["original_max_position_embeddings"] = 1000;  // 628 now in the middle band
  const double s = (1000 / (2 * std::acos(-1.0) / 0.01) - 1.0) / 3.0;
  EXPECT_NEAR(parse(j).rope_freq_factors[1], 1 / ((1 - s) / 8.0 + s), 1e-12);
  // Without original_max_position_embeddings, transformers takes max_position_embeddings (32).
  j["rope_parameters"].erase("original_max_position_embeddings");
  EXPECT_EQ(parse(j).rope_freq_factors, c.rope_freq_factors);
  j["rope_parameters"].erase("high_freq_factor");
  EXPECT_ERROR(parse(j), "llama3 RoPE scaling needs factor, low_freq_factor and high_freq_factor");
  j["rope_parameters"]["high_freq_factor"] = 0.5;
  EXPECT_ERROR(parse(j), "needs 0 < low_freq_factor < high_freq_factor");
  j = tiny_config();
  j["rope_parameters"]["low_freq_factor"] = 1.0;
  EXPECT_ERROR(parse(j),
               "rope_parameters.low_freq_factor: is not a parameter of RoPE type 'default'");
}

// YaRN as transformers' _compute_yarn_parameters: head_dim 4 (2 pairs) at theta 100 and original
// 128 puts the correction range of 32 and 1 rotations (-0.2 and 1.3) at dims [0, 2] once floored
// and ceiled, so pair 0 keeps its frequency and pair 1 is half interpolated; the attention factor
// 0.1 ln(factor) + 1, or the mscale ratio, or as given.
TEST(HfConfig, ReadsYarnRopeScalingAsFrequencyFactorsAndAnAttentionFactor) {
  json j = tiny_config("qwen3");
  j["max_position_embeddings"] = 128;
  j["rope_parameters"] = {{"rope_type", "yarn"},
                          {"rope_theta", 100.0},
                          {"factor", 4.0},
                          {"original_max_position_embeddings", 128}};
  CausalLMConfig c = parse(j);
  EXPECT_EQ(c.rope_type, "yarn");
  ASSERT_EQ(c.rope_freq_factors.size(), 2u);
  EXPECT_DOUBLE_EQ(c.rope_freq_factors[0], 1.0);
  EXPECT_DOUBLE_EQ(c.rope_freq_factors[1], 1 / (0.5 / 4.0 + 0.5));  // ramp (1 - 0) / (2 - 0)
  EXPECT_NEAR(c.rope_attention_factor, 0.1 * std::log(4.0) + 1, 1e-12);
  EXPECT_EQ(c.rope_original_max_position_embeddings, 128);
  j["rope_parameters"]["truncate"] = false;  // the range [0, 1.3] as it is
  const double ramp = 1 / (4 * std::log(128 / (2 * std::acos(-1.0))) / (2 * std::log(100.0)));
  EXPECT_NEAR(parse(j).rope_freq_factors[1], 1 / (ramp / 4 + 1 - ramp), 1e-12);
  j["rope_parameters"].erase("truncate");
  j["rope_parameters"]["mscale"] = 1.0;
  j["rope_parameters"]["mscale_all_dim"] = 0.5;
  EXPECT_NEAR(parse(j).rope_attention_factor,
              (0.1 * std::log(4.0) + 1) / (0.05 * std::log(4.0) + 1), 1e-12);
  j["rope_parameters"]["attention_factor"] = 0.9;
  EXPECT_EQ(parse(j).rope_attention_factor, 0.9);
  // Without original_max_position_embeddings, transformers takes max_position_embeddings.
  j["rope_parameters"].erase("original_max_position_embeddings");
  EXPECT_EQ(parse(j).rope_freq_factors, c.rope_freq_factors);
  j["rope_parameters"].erase("factor");
  EXPECT_ERROR(parse(j), "rope_parameters: yarn RoPE scaling needs a factor");
  j["rope_parameters"]["factor"] = 4.0;
  j["rope_parameters"]["short_factor"] = {1.0, 1.0};
  EXPECT_ERROR(parse(j), "rope_parameters.short_factor: is not a parameter of RoPE type 'yarn'");
}

// Phi-3: Phi3Config's defaults, LongRoPE's factors with the top-level original length (over
// rope_parameters', as transformers takes it), "yarn" read as longrope, what Phi-3 does not
// accept refused by name.
TEST(HfConfig, ReadsPhi3WithLongRopeAndPhi3ConfigsDefaults) {
  json j = tiny_config();
  j["model_type"] = "phi3";
  j["architectures"] = {"Phi3ForCausalLM"};
  j["vocab_size"] = 32064;
  j.erase("rms_norm_eps");
  j.erase("max_position_embeddings");
  CausalLMConfig c = parse(j);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.max_position_embeddings, 4096);
  EXPECT_EQ(c.pad_token_id, 32000);
  j["vocab_size"] = 64;
  EXPECT_ERROR(parse(j), "pad_token_id: is absent, and Phi3Config's default 32000 is not a row");
  j["pad_token_id"] = nullptr;
  EXPECT_FALSE(parse(j).pad_token_id.has_value());
  j["resid_pdrop"] = 0.1;
  j["embd_pdrop"] = 0.1;  // unused by Phi3Model
  j["sliding_window"] = 8;
  c = parse(j);
  EXPECT_EQ(c.hidden_dropout, 0.1);
  EXPECT_EQ(c.layer_windows, (std::vector<std::optional<int64_t>>{8, 8}));
  j["max_position_embeddings"] = 64;
  j["original_max_position_embeddings"] = 16;
  j["rope_parameters"] = {{"rope_type", "longrope"},
                          {"rope_theta", 1e4},
                          {"short_factor", {1.0, 2.0}},
                          {"long_factor", {3.0, 4.0}}};
  c = parse(j);
  EXPECT_EQ(c.rope_type, "longrope");
  EXPECT_EQ(c.rope_freq_factors, (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(c.rope_long_freq_factors, (std::vector<double>{3.0, 4.0}));
  EXPECT_EQ(c.rope_original_max_position_embeddings, 16);
  EXPECT_NEAR(c.rope_attention_factor, std::sqrt(1 + std::log(4.0) / std::log(16.0)), 1e-12);
  for (const char* old_name : {"su", "yarn"}) {  // Phi3Config: the old names of longrope
    j["rope_parameters"]["rope_type"] = old_name;
    EXPECT_EQ(parse(j).rope_type, "longrope") << old_name;
    EXPECT_EQ(parse(j).rope_long_freq_factors, c.rope_long_freq_factors) << old_name;
  }
  j["rope_parameters"]["original_max_position_embeddings"] = 8;
  EXPECT_ERROR(parse(j),
               "rope_parameters.original_max_position_embeddings: differs from the top-level "
               "original_max_position_embeddings 16");
  j["rope_parameters"].erase("original_max_position_embeddings");
  j["rope_parameters"]["long_factor"] = {3.0};
  EXPECT_ERROR(parse(j), "rope_parameters.long_factor: has 1 factors for 2 rotary pairs");
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_ERROR(parse(j),
               "rope_parameters.rope_type: 'linear' RoPE scaling is not supported by "
               "te-cpp for phi3 (it supports 'default', 'longrope')");
  j["rope_parameters"] = {{"rope_type", "default"}};
  j["head_dim"] = 8;
  EXPECT_ERROR(parse(j), "head_dim: is not hidden_size / num_attention_heads");
  j.erase("head_dim");
  j["attention_bias"] = true;  // not a Phi3Config field
  EXPECT_ERROR(parse(j), "attention_bias: is not a field te-cpp honours");
}

TEST(HfConfig, RefusesWhatItDoesNotHonourNamingTheField) {
  json j = tiny_config();
  j["rope_parameters"] = {{"rope_type", "dynamic"}, {"factor", 4.0}, {"rope_theta", 1e4}};
  EXPECT_ERROR(parse(j), "rope_parameters.rope_type: 'dynamic' RoPE scaling is not supported");
  j = tiny_config();
  j["rope_parameters"]["beta_fast"] = 32;  // YaRN's
  EXPECT_ERROR(parse(j), "rope_parameters.beta_fast: is not a parameter of RoPE type 'default'");
  j = tiny_config();
  j["rope_parameters"]["extrapolation_factor"] = 1;
  EXPECT_ERROR(parse(j), "rope_parameters.extrapolation_factor: is not a field te-cpp honours");
  j = tiny_config();
  j["num_experts"] = 8;
  EXPECT_ERROR(parse(j), "'config.json': num_experts: is not a field te-cpp honours (value 8)");
  j = tiny_config();
  j["model_type"] = "falcon";
  EXPECT_ERROR(parse(j), "model_type: 'falcon' is not a causal LM family te-cpp loads");
  j = tiny_config();
  j["architectures"] = {"LlamaForSequenceClassification"};
  EXPECT_ERROR(parse(j), "architectures: entry \"LlamaForSequenceClassification\" is not one");
  j = tiny_config();
  j.erase("vocab_size");
  EXPECT_ERROR(parse(j), "vocab_size is missing");
  j = tiny_config();
  j["hidden_size"] = "16";
  EXPECT_ERROR(parse(j), "hidden_size: expected an integer, got \"16\"");
  j = tiny_config();
  j["hidden_act"] = "gelu";
  EXPECT_ERROR(parse(j), "hidden_act: 'gelu'");
  j = tiny_config();
  j["num_key_value_heads"] = 3;
  EXPECT_ERROR(parse(j), "num_key_value_heads: 3 does not divide num_attention_heads 4");
  j = tiny_config();
  j["use_sliding_window"] = true;  // a Qwen field on a Llama
  EXPECT_ERROR(parse(j), "use_sliding_window: is not a field te-cpp honours");
  j = tiny_config();
  j["sliding_window"] = 16;  // transformers' Llama has no window
  EXPECT_ERROR(parse(j), "sliding_window: is not a field te-cpp honours");
  j = tiny_config();
  j["head_dim"] = -1;
  EXPECT_ERROR(parse(j), "head_dim: must be positive, got -1");
  j = tiny_config();
  j["rope_theta"] = 500.0;  // and 10000 in rope_parameters
  EXPECT_ERROR(parse(j), "rope_theta: is given twice with different values");
  j = tiny_config();
  j["partial_rotary_factor"] = 0.3;  // int(4 * 0.3) = 1 rotary dim: odd
  EXPECT_ERROR(parse(j), "gives 1 rotary dims of a 4-dim head");
  j = tiny_config();
  j["num_hidden_layers"] = 1 << 20;
  EXPECT_ERROR(parse(j), "num_hidden_layers: 1048576 is not in [1, 65536]");
  // GPT-2: transformers' defaults, what it does not build refused by name.
  const json gpt2 = {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}},
                     {"vocab_size", 64},     {"n_embd", 16},
                     {"n_layer", 2},         {"n_head", 4},
                     {"n_positions", 32},    {"summary_type", "cls_index"}};
  const CausalLMConfig g = parse(gpt2);
  EXPECT_EQ(g.positions, "learned");
  EXPECT_EQ(g.intermediate_size, 64);                              // 4 x n_embd
  EXPECT_EQ(g.mlp_activations, std::vector<std::string>{"gelu"});  // gelu_new: the tanh form
  EXPECT_TRUE(g.tie_word_embeddings && g.fuse_qkv);
  j = gpt2;
  j["scale_attn_by_inverse_layer_idx"] = true;
  EXPECT_ERROR(parse(j), "scale_attn_by_inverse_layer_idx: true is not implemented");
  j = gpt2;
  j["activation_function"] = "quick_gelu";
  EXPECT_ERROR(parse(j), "activation_function: 'quick_gelu' is not one te-cpp builds");
  j = gpt2;
  j["n_ctx"] = 16;
  EXPECT_ERROR(parse(j), "n_ctx: differs from n_positions");
  EXPECT_ERROR(parse_causal_lm_config("{\"model_type\": ", "x/config.json"),
               "'x/config.json' is not JSON");
  test::TempDir dir;
  EXPECT_ERROR(read_causal_lm_config(dir.path().string()), "config.json'; a Hugging Face model");
}

TEST(HfLoad, ASavedModelLoadsBackWholeOrFromShardedFiles) {
  for (bool two_files : {false, true}) {
    for (const char* type : {"llama", "qwen2", "qwen3"}) {
      test::TempDir dir;
      json config = tiny_config(type);
      config["tie_word_embeddings"] = std::string(type) == "qwen2";
      CausalLM saved = save_random(dir.path(), config, two_files);
      te::nn::manual_seed(99);  // a different initialisation, overwritten by the load
      int64_t bytes = 0;
      LoadOptions o;
      o.bytes_read = &bytes;
      CausalLM loaded = load_causal_lm(dir.path().string(), o);
      int64_t numel = 0;
      for (const auto& [name, t] : params_of(saved)) {
        EXPECT_TRUE(at::equal(params_of(loaded).at(name), t)) << type << " " << name;
        numel += t.numel();
      }
      EXPECT_EQ(bytes, numel * 4) << type;
      const at::Tensor x = ids();
      EXPECT_TRUE(at::equal(loaded->forward(x), saved->forward(x))) << type;
    }
  }
}

TEST(HfLoad, ACalibratedModelServesFromFp8WeightsTiedHeadIncluded) {
  for (const bool tied : {false, true}) {
    test::TempDir dir;
    json config = tiny_config("llama");
    config["tie_word_embeddings"] = tied;
    save_random(dir.path(), config);
    CausalLM model = load_causal_lm(dir.path().string());
    const at::Tensor x = ids();
    c10::InferenceMode inference;
    const at::Tensor want = model->forward(x);
    EXPECT_ERROR(te::nn::freeze_fp8_weights(*model), "has no input scale");
    EXPECT_FALSE(te::nn::has_fp8_weights(*model));  // refused whole: nothing changed
    {
      te::Fp8Autocast calibrate(/*enabled=*/false, te::fp8::DelayedScaling{}, std::nullopt,
                                /*calibrating=*/true);
      model->forward(x);
    }
    // The table (and, untied, the head); q, kv, out, MLP in and out in each of two layers.
    EXPECT_EQ(te::nn::freeze_fp8_weights(*model), (tied ? 1 : 2) + 2 * 5) << tied;
    for (const auto& p : model->named_parameters()) {
      EXPECT_EQ(p.key().find("kernel"), std::string::npos) << p.key();
      EXPECT_EQ(p.key().find("embedding"), std::string::npos) << p.key();
    }
    const at::Tensor got = model->forward(x);
    EXPECT_FALSE(at::allclose(got, want, 1e-6, 1e-6)) << tied;
    const at::Tensor cos = at::cosine_similarity(got.flatten(0, 1), want.flatten(0, 1), 1);
    // E4M3 on a 16-wide random model: each position's logits within a few degrees (0.978 at
    // worst here); the real model's fidelity is check_minilm.py's.
    EXPECT_GT(cos.min().item<double>(), 0.95) << tied;
  }
}

// On one of two thread ranks: the mesh "tp", TE's MeshResource tp and the vocabulary over it.
struct TwoTensorParallelRanks {
  static MeshResource resource_of() {
    MeshResource r;
    r.tp = "tp";
    return r;
  }
  DeviceMesh mesh{{2}, {"tp"}};
  MeshScope on{mesh};
  MeshResourceScope resource{resource_of()};
  AxisRulesScope rules{extend_logical_axis_rules(parse_axis_rules("vocab=tp"))};
};

TEST(HfLoad, TwoTensorParallelRanksEachReadAboutHalfAndEqualOneProcess) {
  test::TempDir dir;
  const json config = tiny_config();
  CausalLM saved = save_random(dir.path(), config);
  const at::Tensor x = ids();
  const at::Tensor want = saved->forward(x);
  const int64_t file_bytes = static_cast<int64_t>(fs::file_size(dir / "model.safetensors"));
  std::mutex mutex;
  std::vector<int64_t> bytes(2, 0);
  run_local_ranks(2, [&](int rank) {
    const TwoTensorParallelRanks tp;
    LoadOptions o;
    o.bytes_read = &bytes[static_cast<std::size_t>(rank)];
    CausalLM model = load_causal_lm(dir.path().string(), o);
    EXPECT_TRUE(model->embed->is_sharded());
    const at::Tensor logits = model->forward_on_mesh(x).full_tensor();
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_TRUE(at::allclose(logits, want, 1e-5, 1e-6)) << "rank " << rank;
  });
  for (int64_t b : bytes) {
    EXPECT_LT(b, file_bytes * 55 / 100) << "of " << file_bytes;
    EXPECT_GT(b, file_bytes * 40 / 100) << "of " << file_bytes;
  }
}

TEST(HfLoad, NamesEveryBadFile) {
  test::TempDir dir;
  const json config = tiny_config();
  save_random(dir.path(), config);
  const std::string d = dir.path().string();
  const std::string file = (dir / "model.safetensors").string();
  te::nn::SafetensorsReader reader(file);
  std::map<std::string, at::Tensor> all;
  for (const std::string& name : reader.names()) all[name] = reader.read(name);
  // A missing tensor, an extra one (skipped when not strict), a wrong shape.
  auto with = [&](std::map<std::string, at::Tensor> tensors) {
    te::nn::write_safetensors(file, tensors);
  };
  auto missing = all;
  missing.erase("model.layers.1.mlp.up_proj.weight");
  with(missing);
  EXPECT_ERROR(load_causal_lm(d), "lacks 'model.layers.1.mlp.up_proj.weight', which a llama");
  auto extra = all;
  extra["model.layers.2.mlp.up_proj.weight"] = at::zeros({2});
  with(extra);
  EXPECT_ERROR(load_causal_lm(d), "holds 'model.layers.2.mlp.up_proj.weight', which a llama");
  LoadOptions lenient;
  lenient.strict = false;
  EXPECT_NO_THROW(load_causal_lm(d, lenient));
  auto wrong = all;
  wrong["model.norm.weight"] = at::zeros({17});
  with(wrong);
  EXPECT_ERROR(load_causal_lm(d),
               "'model.norm.weight' in '" + file + "' has shape [17] but config.json implies [16]");
  // A dtype LibTorch cannot hold, and a damaged header.
  // (the first tensor the load reads: the embedding table, [64, 16])
  const std::string header = R"({"model.embed_tokens.weight":{"dtype":"U16","shape":[64,16],)"
                             R"("data_offsets":[0,2048]}})";
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header << std::string(2048, '\0');
  }
  EXPECT_ERROR(load_causal_lm(d, lenient), "has dtype 'U16', which te-cpp cannot hold");
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out << "not a safetensors file at all";
  }
  EXPECT_ERROR(load_causal_lm(d), file);
  fs::remove(file);
  EXPECT_ERROR(load_causal_lm(d), "holds neither model.safetensors nor");
}

// A GGUF file built byte by byte (version 3, little-endian), as llama.cpp's writer lays it out.
class GgufBytes {
 public:
  std::string bytes = "GGUF";
  template <typename T>
  GgufBytes& put(T v) {
    bytes.append(reinterpret_cast<const char*>(&v), sizeof(T));
    return *this;
  }
  GgufBytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    bytes += s;
    return *this;
  }
  // Pads to GGUF's default 32-byte alignment.
  GgufBytes& align() {
    bytes.append((32 - bytes.size() % 32) % 32, '\0');
    return *this;
  }
  void write(const fs::path& path) const { std::ofstream(path, std::ios::binary) << bytes; }
};

// One Q8_0 tensor `w` [3, 64] (each row two blocks: scale d = 0.5 (f16 0x3800), codes
// q = (row * 64 + col) % 100 - 50) and one F32 tensor "v" [4], after `kv_count` metadata
// entries `kv` (their bytes).
GgufBytes q8_file(const std::string& w = "w", uint64_t kv_count = 0, const std::string& kv = "") {
  GgufBytes g;
  g.put<uint32_t>(3).put<uint64_t>(2).put<uint64_t>(kv_count);
  g.bytes += kv;
  g.str(w).put<uint32_t>(2).put<uint64_t>(64).put<uint64_t>(3).put<uint32_t>(8).put<uint64_t>(0);
  g.str("v").put<uint32_t>(1).put<uint64_t>(4).put<uint32_t>(0).put<uint64_t>(224);
  g.align();
  for (int row = 0; row < 3; ++row) {
    for (int block = 0; block < 2; ++block) {
      g.put<uint16_t>(0x3800);
      for (int j = 0; j < 32; ++j) {
        g.put<int8_t>(static_cast<int8_t>((row * 64 + block * 32 + j) % 100 - 50));
      }
    }
  }
  g.align();  // 204 bytes of blocks; "v" at the next multiple of 32, 224
  for (float f : {1.5f, -2.0f, 0.25f, 8.0f}) g.put<float>(f);
  return g;
}

TEST(Gguf, ReadsABoxOfAQuantizedTensorAsTheWholeNarrowed) {
  test::TempDir dir;
  q8_file().write(dir / "t.gguf");
  GgufFile file((dir / "t.gguf").string());
  ASSERT_EQ(file.header().tensors.size(), 2u);
  EXPECT_EQ(file.tensor("w")->shape, (std::vector<int64_t>{3, 64}));
  const at::Tensor whole = file.read("w", {0, 0}, {3, 64});
  const at::Tensor want = (at::arange(3 * 64, at::kFloat).remainder(100) - 50).view({3, 64}) * 0.5;
  EXPECT_TRUE(at::equal(whole, want));
  int64_t bytes = 0;
  EXPECT_TRUE(
      at::equal(file.read("w", {1, 5}, {3, 40}, &bytes), whole.narrow(0, 1, 2).narrow(1, 5, 35)));
  EXPECT_EQ(bytes, 2 * 2 * 34);  // the two blocks of each of the two rows
  EXPECT_TRUE(at::equal(file.read("v", {1}, {3}), at::tensor({-2.0f, 0.25f})));
  EXPECT_ERROR(file.read("w", {0, 0}, {4, 64}), "box [0, 4) of dim 0 is outside [3, 64]");
}

TEST(Gguf, NamesEveryDamagedHeader) {
  test::TempDir dir;
  const fs::path path = dir / "bad.gguf";
  auto fails = [&](const GgufBytes& g, const std::string& words) {
    g.write(path);
    EXPECT_ERROR(GgufFile(path.string()), words);
  };
  GgufBytes magic;
  magic.bytes = "GGML";
  magic.put<uint32_t>(3);
  fails(magic, "the file does not start with GGUF");
  GgufBytes v1;
  v1.put<uint32_t>(1).put<uint64_t>(0).put<uint64_t>(0);
  fails(v1, "GGUF version 1 is not supported");
  GgufBytes many;
  many.put<uint32_t>(3).put<uint64_t>(1000000).put<uint64_t>(0);
  fails(many, "tensor_count: 1000000 items cannot fit in the rest of the file");
  GgufBytes long_key;
  long_key.put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(1).put<uint64_t>(1u << 30);
  long_key.bytes.append(64, 'k');
  fails(long_key, "metadata key 0: 1073741824 items cannot fit");
  GgufBytes type;
  type.put<uint32_t>(3).put<uint64_t>(1).put<uint64_t>(0);
  type.str("x").put<uint32_t>(1).put<uint64_t>(32).put<uint32_t>(99).put<uint64_t>(0);
  fails(type, "has ggml type 99, which te-cpp does not read");
  GgufBytes outside;
  outside.put<uint32_t>(3).put<uint64_t>(1).put<uint64_t>(0);
  outside.str("x").put<uint32_t>(1).put<uint64_t>(32).put<uint32_t>(0).put<uint64_t>(0);
  outside.align();  // no data follows
  fails(outside, "tensor 'x': its 128 bytes at offset 0 (aligned?) do not lie inside the file");
  GgufBytes rows;
  rows.put<uint32_t>(3).put<uint64_t>(1).put<uint64_t>(0);
  rows.str("x").put<uint32_t>(1).put<uint64_t>(48).put<uint32_t>(8).put<uint64_t>(0);
  fails(rows, "rows of 48 elements are not whole blocks of 32");
  GgufBytes cut = q8_file();
  cut.bytes.resize(cut.bytes.size() - 10);
  fails(cut, "tensor 'v': its 16 bytes at offset 224 (aligned?) do not lie inside the file");
}

TEST(Gguf, AModelFileIsReadStrictly) {
  test::TempDir dir;
  const fs::path path = dir / "m.gguf";
  auto text = [](const std::string& key, const std::string& value) {
    GgufBytes g;
    g.bytes.clear();
    g.str(key).put<uint32_t>(8).str(value);
    return g.bytes;
  };
  auto u32 = [](const std::string& key, uint32_t value) {
    GgufBytes g;
    g.bytes.clear();
    g.str(key).put<uint32_t>(4).put<uint32_t>(value);
    return g.bytes;
  };
  q8_file("token_embd.weight", 1, text("general.architecture", "gemma")).write(path);
  EXPECT_ERROR(load_causal_lm(path.string()),
               "general.architecture 'gemma' is not one te-cpp loads (" +
                   causal_lm_family_names(/*gguf=*/true) + ")");
  auto f32_key = [](const std::string& key, float value) {
    GgufBytes g;
    g.bytes.clear();
    g.str(key).put<uint32_t>(6).put<float>(value);
    return g.bytes;
  };
  const std::string llama = text("general.architecture", "llama") +
                            u32("llama.embedding_length", 64) + u32("llama.block_count", 1) +
                            u32("llama.feed_forward_length", 32) +
                            u32("llama.attention.head_count", 2);
  q8_file("token_embd.weight", 1, text("general.architecture", "llama")).write(path);
  EXPECT_ERROR(load_causal_lm(path.string()), "metadata 'llama.embedding_length' is missing");
  // A dense llama file may say it has 0 experts (llama.cpp's llama-model-saver writes so); one
  // with experts is Mixtral's (llama.cpp's converter writes it so).
  q8_file("token_embd.weight", 6, llama + u32("llama.expert_count", 0)).write(path);
  EXPECT_ERROR(load_causal_lm(path.string()),
               "lacks 'model.layers.0.self_attn.q_proj.weight', which a llama model");
  q8_file("token_embd.weight", 6, llama + u32("llama.expert_count", 8)).write(path);
  EXPECT_ERROR(load_causal_lm(path.string()),
               "llama.expert_used_count: is missing or not positive; a mixture of experts");
  q8_file("token_embd.weight", 6, llama + u32("llama.vocab_size", 5)).write(path);
  EXPECT_ERROR(load_causal_lm(path.string()),
               "token_embd.weight is [3, 64] but the metadata says llama.vocab_size 5");
  // A mixture of experts' counts (qwen3moe: llama.cpp's keys).
  const std::string qwen3moe =
      text("general.architecture", "qwen3moe") + u32("qwen3moe.embedding_length", 64) +
      u32("qwen3moe.block_count", 1) + u32("qwen3moe.feed_forward_length", 32) +
      u32("qwen3moe.attention.head_count", 2);
  q8_file("token_embd.weight", 6, qwen3moe + u32("qwen3moe.expert_used_count", 2)).write(path);
  EXPECT_ERROR(load_causal_lm(path.string()),
               "qwen3moe.expert_count: is missing or not positive; a mixture of experts needs it");
  q8_file("token_embd.weight", 7,
          qwen3moe + u32("qwen3moe.expert_count", 2) + u32("qwen3moe.expert_used_count", 4))
      .write(path);
  EXPECT_ERROR(load_causal_lm(path.string()),
               "qwen3moe.expert_used_count: 4 is more than the 2 experts");
  q8_file("token_embd.weight", 7,
          qwen3moe + u32("qwen3moe.expert_count", 2) + u32("qwen3moe.expert_used_count", 1))
      .write(path);
  EXPECT_ERROR(load_causal_lm(path.string()), "which a qwen3_moe model of its config has");
  // YaRN as llama.cpp's keys give it: a factor needed, a key of it te-cpp does not build named.
  q8_file("token_embd.weight", 6, llama + text("llama.rope.scaling.type", "yarn")).write(path);
  EXPECT_ERROR(load_causal_lm(path.string()),
               "llama.rope.scaling.factor: is missing or not positive; yarn RoPE scaling needs it");
  q8_file("token_embd.weight", 7,
          llama + text("llama.rope.scaling.type", "yarn") + f32_key("llama.rope.scaling.factor", 4))
      .write(path);
  EXPECT_ERROR(load_causal_lm(path.string()),
               "llama.rope.scaling.original_context_length: is missing or not positive, and so is "
               "context_length");
  q8_file("token_embd.weight", 9,
          llama + text("llama.rope.scaling.type", "yarn") +
              f32_key("llama.rope.scaling.factor", 4) +
              u32("llama.rope.scaling.original_context_length", 32) +
              f32_key("llama.rope.scaling.yarn_ext_factor", 0.5))
      .write(path);
  EXPECT_ERROR(load_causal_lm(path.string()),
               "metadata 'llama.rope.scaling.yarn_ext_factor' is not a key te-cpp honours");
  // OLMoE's q/k norms (llama.cpp requires them); gpt-oss's window on its even layers.
  const std::string olmoe = text("general.architecture", "olmoe") +
                            u32("olmoe.embedding_length", 64) + u32("olmoe.block_count", 1) +
                            u32("olmoe.feed_forward_length", 32) +
                            u32("olmoe.attention.head_count", 2);
  q8_file("token_embd.weight", 5, olmoe).write(path);
  EXPECT_ERROR(load_causal_lm(path.string()),
               "olmoe.block_count: the layers have no attn_q_norm / attn_k_norm");
  const std::string gpt_oss =
      text("general.architecture", "gpt-oss") + u32("gpt-oss.embedding_length", 64) +
      u32("gpt-oss.block_count", 1) + u32("gpt-oss.feed_forward_length", 32) +
      u32("gpt-oss.attention.head_count", 2) + u32("gpt-oss.expert_count", 4) +
      u32("gpt-oss.expert_used_count", 2) + u32("gpt-oss.expert_feed_forward_length", 32);
  q8_file("token_embd.weight", 8, gpt_oss).write(path);
  EXPECT_ERROR(load_causal_lm(path.string()),
               "gpt-oss.attention.sliding_window: is missing or not positive; gpt-oss's even "
               "layers slide");
  // Everything the config implies but the tensors: the first one missing is named.
  q8_file("token_embd.weight", 5, llama).write(path);
  EXPECT_ERROR(load_causal_lm(path.string()), "lacks 'model.layers.0.self_attn.q_proj.weight'");
  // Gemma 2: transformers' GGUF loader takes Gemma2Config's soft caps (50, 30) whatever the file
  // says; te-cpp refuses a file that says otherwise rather than differ.
  auto f32 = [](const std::string& key, float value) {
    GgufBytes g;
    g.bytes.clear();
    g.str(key).put<uint32_t>(6).put<float>(value);
    return g.bytes;
  };
  const std::string gemma2 =
      text("general.architecture", "gemma2") + u32("gemma2.embedding_length", 64) +
      u32("gemma2.block_count", 1) + u32("gemma2.feed_forward_length", 32) +
      u32("gemma2.attention.head_count", 2) + u32("gemma2.attention.key_length", 32);
  q8_file("token_embd.weight", 7, gemma2 + f32("gemma2.attn_logit_softcapping", 20)).write(path);
  EXPECT_ERROR(load_causal_lm(path.string()),
               "gemma2.attn_logit_softcapping: 20.000000 is not Gemma2Config's 50.000000");
  // ... and a Gemma file's RoPE scaling, which transformers' GGUF loader does not read.
  q8_file(
      "token_embd.weight", 8,
      gemma2 + text("gemma2.rope.scaling.type", "linear") + f32("gemma2.rope.scaling.factor", 2))
      .write(path);
  EXPECT_ERROR(load_causal_lm(path.string()),
               "gemma2.rope.scaling.type: this file scales its RoPE ('linear'");
  // Its tokenizer: a kind te-cpp does not build is named, a byte-level one without merges too, a
  // SentencePiece one without scores too, a WordPiece one without its unknown token too.
  q8_file("token_embd.weight", 1, text("tokenizer.ggml.model", "t5")).write(path);
  EXPECT_ERROR(Tokenizer::from_file(path.string()),
               "tokenizer.ggml.model: 't5' is not a tokenizer te-cpp builds");
  GgufBytes tokens;
  tokens.bytes.clear();
  tokens.str("tokenizer.ggml.tokens").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(2);
  tokens.str("a").str("b");
  q8_file("token_embd.weight", 2, text("tokenizer.ggml.model", "gpt2") + tokens.bytes).write(path);
  EXPECT_ERROR(Tokenizer::from_file(path.string()), "tokenizer.ggml.merges: is missing");
  q8_file("token_embd.weight", 2, text("tokenizer.ggml.model", "llama") + tokens.bytes).write(path);
  EXPECT_ERROR(Tokenizer::from_file(path.string()), "tokenizer.ggml.scores: is missing");
  GgufBytes nan_score;
  nan_score.bytes.clear();
  nan_score.str("tokenizer.ggml.scores").put<uint32_t>(9).put<uint32_t>(6).put<uint64_t>(2);
  nan_score.put<float>(0.0f).put<float>(std::nanf(""));
  q8_file("token_embd.weight", 3,
          text("tokenizer.ggml.model", "llama") + tokens.bytes + nan_score.bytes)
      .write(path);
  EXPECT_ERROR(Tokenizer::from_file(path.string()),
               "tokenizer.ggml.scores: entry 1 is not a finite number");
  q8_file("token_embd.weight", 2, text("tokenizer.ggml.model", "bert") + tokens.bytes).write(path);
  EXPECT_ERROR(Tokenizer::from_file(path.string()),
               "tokenizer.ggml.unknown_token_id: 100 is not a token id");
  // Gemma 4's BPE: spaces as U+2581 with no prefix, the file's merges, a character without a
  // token as its bytes' <0xHH> tokens, and BOS whatever add_bos_token says (llama.cpp's).
  {
    GgufBytes g4;
    g4.bytes.clear();
    g4.str("tokenizer.ggml.tokens").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(8);
    g4.str("<unk>").str("<bos>").str("a").str("b").str("ab").str("\xE2\x96\x81");
    g4.str(
          "\xE2\x96\x81"
          "a")
        .str("<0x63>");
    g4.str("tokenizer.ggml.merges").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(2);
    g4.str("a b").str("\xE2\x96\x81 a");
    g4.str("tokenizer.ggml.add_bos_token").put<uint32_t>(7).put<uint8_t>(0);
    q8_file("token_embd.weight", 6,
            text("tokenizer.ggml.model", "gemma4") + g4.bytes +
                u32("tokenizer.ggml.unknown_token_id", 0) + u32("tokenizer.ggml.bos_token_id", 1))
        .write(path);
    const Tokenizer gemma4 = Tokenizer::from_file(path.string());
    EXPECT_EQ(gemma4.encode("ab a c").ids, (std::vector<int64_t>{1, 4, 6, 5, 7}));
    EXPECT_EQ(gemma4.decode({4, 6, 5, 7}), "ab a c");
  }
  // A token spelled twice (plain "a" is "a" in the byte alphabet too) is named.
  GgufBytes twice;
  twice.bytes.clear();
  twice.str("tokenizer.ggml.tokens").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(3);
  twice.str("a").str("b").str("a");
  twice.str("tokenizer.ggml.merges").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(1);
  twice.str("a b");
  q8_file("token_embd.weight", 3, text("tokenizer.ggml.model", "gpt2") + twice.bytes).write(path);
  EXPECT_ERROR(Tokenizer::from_file(path.string()),
               "tokenizer.ggml.tokens: token 2 'a' is token 0 again");
  // A pre-tokenizer name llama.cpp's table lacks is named, never split as another's.
  GgufBytes vocab;
  vocab.bytes.clear();
  vocab.str("tokenizer.ggml.tokens").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(3);
  vocab.str("a").str("b").str("ab");
  vocab.str("tokenizer.ggml.merges").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(1);
  vocab.str("a b");
  q8_file("token_embd.weight", 4,
          text("tokenizer.ggml.model", "gpt2") + vocab.bytes + text("tokenizer.ggml.pre", "qwen9"))
      .write(path);
  EXPECT_ERROR(Tokenizer::from_file(path.string()),
               "tokenizer.ggml.pre: 'qwen9' is not a pre-tokenizer te-cpp knows; te-cpp splits "
               "text as llama.cpp does for gpt-2,");
  // Known, and without the key (llama.cpp's default split): both read.
  q8_file("token_embd.weight", 4,
          text("tokenizer.ggml.model", "gpt2") + vocab.bytes + text("tokenizer.ggml.pre", "qwen2"))
      .write(path);
  EXPECT_EQ(Tokenizer::from_file(path.string()).encode("ab", {false}).ids,
            (std::vector<int64_t>{2}));
  q8_file("token_embd.weight", 3, text("tokenizer.ggml.model", "gpt2") + vocab.bytes).write(path);
  EXPECT_EQ(Tokenizer::from_file(path.string()).encode("ab", {false}).ids,
            (std::vector<int64_t>{2}));
  // From a header read alone (no tensor data, no LibTorch: what fuzz_gguf calls), the same; a
  // metadata value of another type names the file and the key.
  const GgufHeader header = read_gguf_header(path.string());
  EXPECT_EQ(header.path, path.string());
  EXPECT_EQ(Tokenizer::from_gguf(header).encode("ab", {false}).ids, (std::vector<int64_t>{2}));
  EXPECT_ERROR(header.integer("tokenizer.ggml.model"),
               "m.gguf': metadata 'tokenizer.ggml.model' is not an integer (type 8)");
  EXPECT_ERROR(read_gguf_header((dir / "none.gguf").string()), "gguf: cannot open '");
}

// A one-layer Llama as llama.cpp writes one (hidden 64, 2 heads, FFN 64, vocabulary 8): the
// table in Q4_1, attn_k in Q4_1 beside attn_v in Q8_0 (te's stacked kv_kernel holds rows of two
// types, as a Q4_K_M file's Q4_K attn_k beside its Q6_K attn_v), every other 2-dim weight in
// Q8_0, the norms in F32. Random codes, scales of about 0.02.
void write_tiny_llama_gguf(const fs::path& path) {
  struct Tensor {
    std::string name;
    int64_t rows, cols;
    ggml::Type type;
  };
  const std::vector<Tensor> tensors = {{"token_embd.weight", 8, 64, ggml::Type::kQ4_1},
                                       {"output_norm.weight", 1, 64, ggml::Type::kF32},
                                       {"blk.0.attn_norm.weight", 1, 64, ggml::Type::kF32},
                                       {"blk.0.attn_q.weight", 64, 64, ggml::Type::kQ8_0},
                                       {"blk.0.attn_k.weight", 64, 64, ggml::Type::kQ4_1},
                                       {"blk.0.attn_v.weight", 64, 64, ggml::Type::kQ8_0},
                                       {"blk.0.attn_output.weight", 64, 64, ggml::Type::kQ8_0},
                                       {"blk.0.ffn_norm.weight", 1, 64, ggml::Type::kF32},
                                       {"blk.0.ffn_gate.weight", 64, 64, ggml::Type::kQ8_0},
                                       {"blk.0.ffn_up.weight", 64, 64, ggml::Type::kQ8_0},
                                       {"blk.0.ffn_down.weight", 64, 64, ggml::Type::kQ8_0}};
  GgufBytes g;
  auto u32 = [&](const std::string& key, uint32_t v) {
    g.str(key).put<uint32_t>(4).put<uint32_t>(v);
  };
  g.put<uint32_t>(3).put<uint64_t>(tensors.size()).put<uint64_t>(7);
  g.str("general.architecture").put<uint32_t>(8).str("llama");
  u32("llama.embedding_length", 64);
  u32("llama.block_count", 1);
  u32("llama.feed_forward_length", 64);
  u32("llama.attention.head_count", 2);
  u32("llama.attention.head_count_kv", 2);
  u32("llama.context_length", 32);
  std::vector<int64_t> bytes;
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    const auto b = ggml::block_shape(static_cast<uint32_t>(t.type), t.name);
    bytes.push_back(t.rows * (t.cols / b.elements) * b.bytes);
    g.str(t.name);
    if (t.rows == 1) {
      g.put<uint32_t>(1).put<uint64_t>(t.cols);
    } else {
      g.put<uint32_t>(2).put<uint64_t>(t.cols).put<uint64_t>(t.rows);
    }
    g.put<uint32_t>(static_cast<uint32_t>(t.type)).put<uint64_t>(offset);
    offset += (bytes.back() + 31) / 32 * 32;
  }
  g.align();
  std::mt19937 rng(42);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (t.type == ggml::Type::kF32) {
      for (int64_t k = 0; k < t.cols; ++k) g.put<float>(1.0f + 0.01f * static_cast<float>(k % 7));
    } else {
      const bool q8 = t.type == ggml::Type::kQ8_0;
      for (int64_t block = 0; block < t.rows * t.cols / 32; ++block) {
        g.put<uint16_t>(0x2500 | (rng() & 0xFF));           // d: about 0.02
        if (!q8) g.put<uint16_t>(0xA500 | (rng() & 0xFF));  // m: about -0.02
        for (int j = 0; j < (q8 ? 32 : 16); ++j) g.put<uint8_t>(static_cast<uint8_t>(rng()));
      }
    }
    g.align();
  }
  g.write(path);
}

TEST(GgufBlocks, OneProcessHoldsTheQuantizedWeightsInTheirBlocksAndEqualsFloat32) {
  test::TempDir dir;
  const fs::path path = dir / "tiny.gguf";
  write_tiny_llama_gguf(path);
  int64_t read_blocks = 0, read_float = 0;
  LoadOptions blocks_options, float_options;
  blocks_options.bytes_read = &read_blocks;
  float_options.bytes_read = &read_float;
  float_options.dequantize_gguf = true;
  CausalLM blocks = load_causal_lm(path.string(), blocks_options);
  CausalLM floats = load_causal_lm(path.string(), float_options);
  EXPECT_TRUE(nn::has_block_weights(*blocks));
  EXPECT_FALSE(nn::has_block_weights(*floats));
  // Held: the table (tied head), q, kv (K's rows Q4_1, V's Q8_0), out, wi (gate and up, both
  // Q8_0) and wo.
  const auto params = blocks->named_parameters();
  for (const char* held :
       {"embed.embedding", "layers.0.self_attention.q_kernel", "layers.0.self_attention.kv_kernel",
        "layers.0.self_attention.out_kernel", "layers.0.mlp.wi_kernel", "layers.0.mlp.wo_kernel"}) {
    EXPECT_FALSE(params.contains(held)) << held;
    EXPECT_TRUE(floats->named_parameters().contains(held)) << held;
  }
  const auto& kv = *blocks->layers[0]
                        ->as<nn::TransformerLayerImpl>()
                        ->self_attention->held_blocks("kv_kernel")
                        ->matrix;
  EXPECT_EQ(kv.type_names(), "Q4_1 and Q8_0");
  // The held parameters' float32 bytes (table 8 x 64, q, out and wo 64 x 64, kv and wi 64 x 2 x
  // 64) are gone and their blocks' counted: Q4_1 (the table's 8 rows, K's 64) of 2 blocks of 20
  // bytes, Q8_0 (q, V, out, gate, up, wo: 6 x 64 rows) of 2 of 34.
  const int64_t held_floats = 4 * (8 * 64 + 3 * 64 * 64 + 2 * 64 * 2 * 64);
  const int64_t held_blocks = (8 + 64) * 2 * 20 + 6 * 64 * 2 * 34;
  EXPECT_EQ(nn::resident_bytes(*blocks), nn::resident_bytes(*floats) - held_floats + held_blocks);
  EXPECT_EQ(read_blocks, read_float);  // every tensor's bytes, once
  {
    c10::InferenceMode inference;
    // One token (products from the blocks) and a prompt of 12 (through decoded panels).
    for (int64_t n : {1, 12}) {
      const at::Tensor ids = at::arange(n, at::kLong).remainder(8).view({1, n});
      const at::Tensor want = floats->forward(ids), got = blocks->forward(ids);
      EXPECT_LT(((got - want).abs().max() / want.abs().max()).item<double>(), 1e-5) << n;
    }
  }
  // The float32 load trains; the held one names what it cannot do.
  floats->train();
  floats->forward(at::zeros({1, 4}, at::kLong)).sum().backward();
  EXPECT_TRUE(floats->named_parameters()["layers.0.mlp.wi_kernel"].grad().defined());
  EXPECT_ERROR(blocks->forward(at::zeros({1, 4}, at::kLong)).sum().backward(),
               "is held in GGUF Q8_0 blocks (inference only) but its input requires grad");
  EXPECT_ERROR(nn::save_checkpoint(*blocks, (dir / "ckpt").string()),
               "save_checkpoint: 'embed.embedding' is held in GGUF blocks");
}

TEST(GgufBlocks, UnderAMeshEveryWeightIsDequantized) {
  test::TempDir dir;
  const fs::path path = dir / "tiny.gguf";
  write_tiny_llama_gguf(path);
  LoadOptions o;
  o.dequantize_gguf = true;
  CausalLM one = load_causal_lm(path.string(), o);
  const at::Tensor ids = at::arange(6, at::kLong).view({1, 6});
  const at::Tensor want = one->forward(ids);
  std::mutex mutex;
  run_local_ranks(2, [&](int rank) {
    const TwoTensorParallelRanks tp;
    CausalLM model = load_causal_lm(path.string());
    const at::Tensor logits = model->forward_on_mesh(ids).full_tensor();
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_FALSE(nn::has_block_weights(*model)) << "rank " << rank;
    EXPECT_TRUE(at::allclose(logits, want, 1e-5, 1e-6)) << "rank " << rank;
  });
}

}  // namespace
}  // namespace te::hf
