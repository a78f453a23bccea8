// The decoder family registry (te/hf/families.h, hf/src/families/): the supported list that
// errors, --help and the docs give is the registry's, and each registered family reads its own
// config.json (model_type and architecture from its entry).

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "../expect_error.h"
#include "te/hf/causal_lm.h"
#include "te/hf/config.h"
#include "te/hf/families.h"
#include "te/hf/weights.h"

namespace te::hf {
namespace {

using nlohmann::json;

std::string read_text(const std::string& relative) {
  std::ifstream in(std::string(TE_SOURCE_DIR) + "/" + relative, std::ios::binary);
  EXPECT_TRUE(in.good()) << relative;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(Families, NamesAreTheRegistrys) {
  const auto& families = causal_lm_families();
  ASSERT_FALSE(families.empty());
  std::string names, gguf;
  for (const FamilyInfo& f : families) {
    EXPECT_FALSE(f.model_type.empty());
    EXPECT_FALSE(f.architecture.empty()) << f.model_type;
    EXPECT_FALSE(f.title.empty()) << f.model_type;
    names += (names.empty() ? "" : ", ") + f.model_type;
    if (!f.gguf_architecture.empty()) gguf += (gguf.empty() ? "" : ", ") + f.gguf_architecture;
  }
  EXPECT_EQ(causal_lm_family_names(), names);
  EXPECT_EQ(causal_lm_family_names(/*gguf=*/true), gguf);
}

TEST(Families, AnUnknownModelTypeIsRefusedWithTheRegisteredList) {
  EXPECT_ERROR(parse_causal_lm_config(R"({"model_type": "falcon"})", "config.json"),
               "model_type: 'falcon' is not a causal LM family te-cpp loads (" +
                   causal_lm_family_names() + "; a bert encoder loads with te::hf::load_encoder)");
  CausalLMConfig hand_made;
  hand_made.model_type = "falcon";
  EXPECT_ERROR(causal_lm_weight_map(hand_made),
               "causal_lm_weight_map: model_type 'falcon' is not a causal LM family");
}

// Each family's entry is what its config is read by: its architecture accepted, another
// family's refused naming its own.
TEST(Families, EachFamilyReadsConfigsOfItsOwnArchitecture) {
  const auto& families = causal_lm_families();
  for (std::size_t i = 0; i < families.size(); ++i) {
    const FamilyInfo& f = families[i];
    const FamilyInfo& other = families[(i + 1) % families.size()];
    json j = {{"model_type", f.model_type}, {"architectures", {f.architecture}},
              {"vocab_size", 64},           {"hidden_size", 16},
              {"intermediate_size", 24},    {"num_hidden_layers", 2},
              {"num_attention_heads", 4}};
    if (f.model_type == "gpt2") j = {{"model_type", "gpt2"}, {"architectures", {f.architecture}}};
    // Phi3Config's default pad_token_id, 32000, is no row of 64 tokens (refused by name).
    if (f.model_type == "phi3") j["pad_token_id"] = nullptr;
    if (f.model_type == "mixtral" || f.model_type == "gpt_oss") {
      j.update({{"num_local_experts", 4}, {"num_experts_per_tok", 2}});
    }
    if (f.model_type == "olmoe") j.update({{"num_experts", 4}, {"num_experts_per_tok", 2}});
    if (f.model_type == "qwen3_moe" || f.model_type == "qwen2_moe") {
      j.update({{"num_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 8}});
    }
    if (f.model_type == "qwen2_moe") j["shared_expert_intermediate_size"] = 8;
    const CausalLMConfig c = parse_causal_lm_config(j.dump(), "config.json");
    EXPECT_EQ(c.model_type, f.model_type);
    EXPECT_FALSE(causal_lm_weight_map(c).empty()) << f.model_type;
    j["architectures"] = {other.architecture};
    EXPECT_ERROR(parse_causal_lm_config(j.dump(), "config.json"),
                 "architectures: entry \"" + other.architecture +
                     "\" is not one te-cpp builds for model_type '" + f.model_type + "' (" +
                     f.architecture + ")");
  }
}

// The experts' fields: which layers are sparse, the router's choice, and what is refused.
TEST(Families, MixturesOfExpertsReadTheirExpertsFields) {
  json j = {{"model_type", "qwen3_moe"}, {"vocab_size", 64},         {"hidden_size", 16},
            {"intermediate_size", 24},   {"num_hidden_layers", 4},   {"num_attention_heads", 4},
            {"num_local_experts", 8},    {"num_experts_per_tok", 2}, {"moe_intermediate_size", 8},
            {"decoder_sparse_step", 2},  {"mlp_only_layers", {3}},   {"norm_topk_prob", true}};
  const CausalLMConfig c = parse_causal_lm_config(j.dump(), "config.json");
  EXPECT_EQ(c.num_experts, 8);  // transformers 5 writes Qwen3-MoE's count as num_local_experts
  EXPECT_EQ(c.layer_moe, (std::vector<bool>{false, true, false, false}));
  const auto sparse = layer_options(c, 1), dense = layer_options(c, 0);
  ASSERT_TRUE(sparse.moe().has_value());
  EXPECT_FALSE(dense.moe().has_value());
  EXPECT_EQ(sparse.moe()->ffn_hidden_size(), 8);
  EXPECT_FALSE(sparse.moe()->router().use_pre_softmax);  // renormalised: softmax of the top k
  const WeightMap map = causal_lm_weight_map(c);
  EXPECT_EQ(map.count("layers.1.moe.wi_kernel"), 1u);
  EXPECT_EQ(map.at("layers.1.moe.wi_kernel").size(), 16u);  // gate and up of 8 experts
  EXPECT_EQ(map.count("layers.0.mlp.wi_kernel"), 1u);
  EXPECT_EQ(map.count("layers.1.mlp.wi_kernel"), 0u);
  auto refused = [&](json change, const std::string& words) {
    json bad = j;
    bad.update(change);
    EXPECT_ERROR(parse_causal_lm_config(bad.dump(), "config.json"), words);
  };
  EXPECT_FALSE(c.output_router_logits);
  json counted = j;
  counted.update({{"output_router_logits", true}, {"router_aux_loss_coef", 0.25}});
  const CausalLMConfig with_loss = parse_causal_lm_config(counted.dump(), "config.json");
  EXPECT_TRUE(with_loss.output_router_logits);
  EXPECT_EQ(with_loss.router_aux_loss_coef, 0.25);
  refused({{"router_aux_loss_coef", -0.5}}, "router_aux_loss_coef: must be a finite number");
  refused({{"num_experts_per_tok", 9}},
          "num_experts_per_tok: 9 experts per token is not in [1, 8]");
  refused({{"mlp_only_layers", {7}}}, "mlp_only_layers: entry 7 is not a layer index");
  refused({{"num_experts", 4}}, "num_local_experts: differs from num_experts");
  refused({{"decoder_sparse_step", 0}}, "decoder_sparse_step: must be positive");
  refused({{"num_local_experts", 0}}, "num_local_experts: 0 experts");
  // Qwen3-MoE's window, when on, is on every layer (Qwen3's layer rules do not apply).
  json windowed = j;
  windowed.update({{"use_sliding_window", true}, {"sliding_window", 6}});
  for (const auto& w : parse_causal_lm_config(windowed.dump(), "config.json").layer_windows) {
    EXPECT_EQ(w, std::optional<int64_t>(6));
  }
  json qwen2 = {{"model_type", "qwen2_moe"},  {"vocab_size", 64},
                {"hidden_size", 16},          {"intermediate_size", 24},
                {"num_hidden_layers", 2},     {"num_attention_heads", 4},
                {"num_experts", 4},           {"num_experts_per_tok", 2},
                {"moe_intermediate_size", 8}, {"shared_expert_intermediate_size", 8},
                {"use_sliding_window", true}};
  EXPECT_ERROR(parse_causal_lm_config(qwen2.dump(), "config.json"),
               "use_sliding_window: is true without layer_types");
  json mixtral = {
      {"model_type", "mixtral"}, {"vocab_size", 64},         {"hidden_size", 16},
      {"intermediate_size", 24}, {"num_hidden_layers", 2},   {"num_attention_heads", 4},
      {"num_local_experts", 4},  {"num_experts_per_tok", 2}, {"router_jitter_noise", 0.1}};
  EXPECT_ERROR(parse_causal_lm_config(mixtral.dump(), "config.json"),
               "router_jitter_noise: te-cpp's router adds no training-time noise");
  mixtral.erase("num_local_experts");
  EXPECT_ERROR(parse_causal_lm_config(mixtral.dump(), "config.json"),
               "num_local_experts is missing");
}

// gpt-oss: GptOssConfig's defaults where config.json is silent (transformers 5.23.0
// models/gpt_oss/configuration_gpt_oss.py), its sinks, biases, clamped SwiGLU and router, its
// fused experts' map (gate_up_proj's gate in the even columns, up in the odd ones), and what it
// refuses.
TEST(Families, GptOssTakesItsConfigClasssDefaultsAndItsFusedExperts) {
  const json j = {{"model_type", "gpt_oss"},  {"vocab_size", 64},       {"hidden_size", 16},
                  {"intermediate_size", 8},   {"num_hidden_layers", 3}, {"num_attention_heads", 4},
                  {"num_key_value_heads", 2}, {"num_local_experts", 4}, {"num_experts_per_tok", 2},
                  {"hidden_act", "gelu"}};  // GptOssExperts ignore it, so does te-cpp
  auto parse = [](const json& config) {
    return parse_causal_lm_config(config.dump(), "config.json");
  };
  const CausalLMConfig c = parse(j);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.layer_windows, (std::vector<std::optional<int64_t>>{128, std::nullopt, 128}));
  EXPECT_TRUE(c.attention_sinks && c.attention_bias && c.qkv_bias && c.mlp_bias && c.router_bias);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.moe_intermediate_size, 8);
  EXPECT_EQ(c.mlp_activations, (std::vector<std::string>{"clamped_silu", "clamped_linear"}));
  EXPECT_EQ(c.swiglu_limit, 7.0);
  EXPECT_EQ(c.swiglu_alpha, 1.702);
  // The default RoPE is yarn, factor 32 over 4096 positions at base 150000, not truncated: the
  // same as giving that object, and not what truncating gives.
  EXPECT_EQ(c.rope_type, "yarn");
  EXPECT_EQ(c.rope_theta, 150000.0);
  EXPECT_EQ(c.rope_original_max_position_embeddings, 4096);
  EXPECT_NEAR(c.rope_attention_factor, 0.1 * std::log(32.0) + 1, 1e-12);
  json given = j;
  given["rope_parameters"] = {{"rope_type", "yarn"},
                              {"factor", 32.0},
                              {"rope_theta", 150000.0},
                              {"truncate", false},
                              {"original_max_position_embeddings", 4096}};
  EXPECT_EQ(parse(given).rope_freq_factors, c.rope_freq_factors);
  given["rope_parameters"]["truncate"] = true;
  EXPECT_NE(parse(given).rope_freq_factors, c.rope_freq_factors);
  json null_head = j;
  null_head["head_dim"] = nullptr;  // GptOssConfig: hidden_size / num_attention_heads
  EXPECT_EQ(parse(null_head).head_dim, 4);

  const WeightMap map = causal_lm_weight_map(c);
  const auto& wi = map.at("layers.0.moe.wi_kernel");
  ASSERT_EQ(wi.size(), 2u);
  for (int64_t slot : {0, 1}) {
    const HfSource& s = wi[static_cast<std::size_t>(slot)];
    EXPECT_EQ(s.name, "model.layers.0.mlp.experts.gate_up_proj");
    EXPECT_EQ(s.slot, slot);
    EXPECT_EQ(s.narrow_start, slot);
    EXPECT_EQ(s.narrow_step, 2);
    EXPECT_FALSE(s.transpose);  // saved [experts, in, out], as te's
  }
  EXPECT_EQ(map.at("layers.2.self_attention.attention.softmax_offset").at(0).name,
            "model.layers.2.self_attn.sinks");
  EXPECT_EQ(map.at("layers.1.moe.gate_bias").at(0).name, "model.layers.1.mlp.router.bias");
  // to_hf_tensors writes each slot back into its columns.
  std::map<std::string, at::Tensor> whole;
  for (const auto& [name, sources] : map) whole[name] = at::zeros({1});
  whole["layers.0.moe.wi_kernel"] = at::randn({4, 16, 2, 8});
  const at::Tensor fused = to_hf_tensors({{"layers.0.moe.wi_kernel", wi}}, whole).at(wi[0].name);
  EXPECT_EQ(fused.sizes(), (std::vector<int64_t>{4, 16, 16}));
  for (int64_t slot : {0, 1}) {
    EXPECT_TRUE(
        at::equal(fused.slice(2, slot, 16, 2), whole["layers.0.moe.wi_kernel"].select(2, slot)));
  }

  json bad = j;
  bad["quantization_config"] = {{"quant_method", "mxfp4"}};
  EXPECT_ERROR(parse(bad), "quantization_config: te-cpp reads gpt-oss's experts in floating point");
  bad = j;
  bad["sliding_window"] = nullptr;
  EXPECT_ERROR(parse(bad), "sliding_window: is null; transformers' gpt-oss needs a window");
  bad = j;
  bad["layer_types"] = {"full_attention", "local", "full_attention"};
  EXPECT_ERROR(parse(bad),
               "layer_types: entry \"local\" is not full_attention or sliding_attention");
  bad = j;
  bad["swiglu_limit"] = 0;
  EXPECT_ERROR(parse(bad), "swiglu_limit: must be positive and finite");
}

// OLMoE: OlmoeConfig's defaults (transformers 5.23.0 models/olmoe/configuration_olmoe.py), its
// full-width q/k norms and clip_qkv, and what it refuses.
TEST(Families, OlmoeNormsWholeQueriesAndKeysAndClips) {
  json j = {{"model_type", "olmoe"},    {"vocab_size", 64},       {"hidden_size", 16},
            {"intermediate_size", 8},   {"num_hidden_layers", 2}, {"num_attention_heads", 4},
            {"num_key_value_heads", 2}, {"num_experts", 4},       {"num_experts_per_tok", 2},
            {"clip_qkv", 8.0}};
  auto parse = [](const json& config) {
    return parse_causal_lm_config(config.dump(), "config.json");
  };
  const CausalLMConfig c = parse(j);
  EXPECT_TRUE(c.qk_norm && c.qk_norm_over_heads);
  EXPECT_EQ(c.clip_qkv, 8.0);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.moe_intermediate_size, 8);
  EXPECT_EQ(c.router_aux_loss_coef, 0.01);
  EXPECT_EQ(c.pad_token_id, 1);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.layer_moe, (std::vector<bool>{true, true}));
  const WeightMap map = causal_lm_weight_map(c);
  EXPECT_EQ(map.at("layers.0.self_attention.q_norm.scale").at(0).name,
            "model.layers.0.self_attn.q_norm.weight");
  EXPECT_EQ(map.at("layers.1.moe.gate_kernel").at(0).name, "model.layers.1.mlp.gate.weight");
  j["clip_qkv"] = nullptr;
  EXPECT_EQ(parse(j).clip_qkv, 0.0);
  j["clip_qkv"] = -1;
  EXPECT_ERROR(parse(j), "clip_qkv: must be positive and finite, or null (none)");
  j["clip_qkv"] = nullptr;
  j["head_dim"] = 8;
  EXPECT_ERROR(parse(j), "head_dim: 8 x 4 heads is not hidden_size 16, which OLMoE's q_norm takes");
}

// The README and the guide name every registered family (the guide by its model_type and, where
// te-cpp reads its GGUF files, its GGUF architecture).
TEST(Families, TheDocsNameEveryRegisteredFamily) {
  const std::string readme = read_text("README.md"), guide = read_text("docs/guide.md");
  for (const FamilyInfo& f : causal_lm_families()) {
    const std::string name = f.title.substr(0, f.title.find(" ("));
    EXPECT_NE(readme.find(name), std::string::npos) << "README.md does not name " << name;
    EXPECT_NE(guide.find("`" + f.model_type + "`"), std::string::npos)
        << "docs/guide.md does not name model_type `" << f.model_type << "`";
    if (!f.gguf_architecture.empty()) {
      EXPECT_NE(guide.find("`" + f.gguf_architecture + "`"), std::string::npos)
          << "docs/guide.md does not name GGUF architecture `" << f.gguf_architecture << "`";
    }
  }
}

}  // namespace
}  // namespace te::hf
