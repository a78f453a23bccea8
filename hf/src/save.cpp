// te::hf::save_causal_lm (see save.h).

#include "te/hf/save.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "save_detail.h"
#include "te/distributed.h"
#include "te/error.h"
#include "te/nn/safetensors.h"
#include "te/nn/sharded.h"

namespace te::hf {

namespace {

// torch_dtype's spelling of a parameter dtype.
const char* hf_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    default:
      TE_FAIL("save_causal_lm: parameters of dtype ", t,
              " have no Hugging Face torch_dtype; convert the model to float32, bfloat16 or "
              "float16");
  }
}

void write_files(const CausalLMImpl& model, const std::string& dir, nlohmann::json config,
                 at::ScalarType dtype, const std::map<std::string, at::Tensor>& whole) {
  config["torch_dtype"] = hf_dtype(dtype);
  config["dtype"] = hf_dtype(dtype);
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  TE_CHECK(!ec, "save_causal_lm: cannot create '", dir, "': ", ec.message());
  nn::write_safetensors((fs::path(dir) / "model.safetensors").string(),
                        to_hf_tensors(model.config, whole));
  const fs::path config_path = fs::path(dir) / "config.json";
  std::ofstream out(config_path);
  out << config.dump(2) << "\n";
  TE_CHECK(out.good(), "save_causal_lm: cannot write '", config_path.string(), "'");
}

}  // namespace

namespace detail {

std::map<std::string, at::Tensor> whole_parameters(const CausalLMImpl& model, const char* what) {
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    const auto* sharded = dynamic_cast<const nn::ShardedModule*>(item.value().get());
    TE_CHECK(sharded == nullptr || sharded->all_held_blocks().empty(), what, ": '", item.key(),
             "' holds GGUF blocks; load the model with LoadOptions::dequantize_gguf = true to ",
             "save it");
  }
  const auto layouts = nn::named_parameter_layouts(model);
  std::map<std::string, at::Tensor> whole;
  const at::ScalarType dtype = model.parameters().at(0).scalar_type();
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    at::Tensor t = p.value().detach();
    TE_CHECK(t.scalar_type() == dtype, what, ": '", p.key(), "' is ", t.scalar_type(),
             " but the other parameters ", dtype, "; convert the model to one dtype first");
    const auto it = layouts.find(p.key());
    if (it != layouts.end() && it->second.mesh) {
      t = DTensor::from_local(t, *it->second.mesh, it->second.placements, it->second.global_shape)
              .full_tensor();
    }
    whole[p.key()] = t.cpu();
  }
  return whole;
}

void on_rank_zero(const std::function<void()>& write) {
  std::string failure;
  if (world_rank() == 0) {
    try {
      write();
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  if (world_size() > 1) {
    const DeviceMesh world({world_size()}, {"save"});
    failure = world.all_gather(failure).front();
  }
  if (!failure.empty()) throw Error(failure);
}

void check_same_sizes(const CausalLMConfig& given, const CausalLMConfig& model,
                      const std::string& where) {
  auto same = [&](const char* field, int64_t a, int64_t b) {
    TE_CHECK(a == b, where, " says ", field, " ", a, " but the model has ", b,
             "; give the model's own");
  };
  same("vocab_size", given.vocab_size, model.vocab_size);
  same("hidden_size", given.hidden_size, model.hidden_size);
  same("num_hidden_layers", given.num_hidden_layers, model.num_hidden_layers);
  same("num_attention_heads", given.num_attention_heads, model.num_attention_heads);
  same("num_key_value_heads", given.num_key_value_heads, model.num_key_value_heads);
  same("intermediate_size", given.intermediate_size, model.intermediate_size);
  same("tie_word_embeddings", given.tie_word_embeddings ? 1 : 0, model.tie_word_embeddings ? 1 : 0);
  same("num_experts", given.num_experts, model.num_experts);
  same("num_experts_per_tok", given.num_experts_per_tok, model.num_experts_per_tok);
  same("moe_intermediate_size", given.moe_intermediate_size, model.moe_intermediate_size);
  same("shared_expert_intermediate_size", given.shared_expert_intermediate_size,
       model.shared_expert_intermediate_size);
  check_same_layers(given, model, where);
}

void check_same_layers(const CausalLMConfig& given, const CausalLMConfig& model,
                       const std::string& where) {
  auto same = [&](const char* field, int64_t a, int64_t b) {
    TE_CHECK(a == b, where, " says ", field, " ", a, " but the model has ", b,
             "; give the model's own");
  };
  auto differ = [&](const char* field, const std::string& a, const std::string& b) {
    TE_CHECK(a == b, where, " says ", field, " ", a, " but the model computes ", b,
             "; its readers would run another model: give the config the model was built from");
  };
  auto text = [](double v) { return c10::str(v); };
  auto list = [&](const std::vector<double>& v) {
    std::string s;
    for (const double x : v) s += (s.empty() ? "" : ",") + text(static_cast<float>(x));
    return "[" + s + "]";
  };
  auto windows = [](const CausalLMConfig& c) {
    std::string s;
    for (const auto& w : c.layer_windows)
      s += (s.empty() ? "" : ",") + (w ? std::to_string(*w) : "-");
    return "[" + s + "]";
  };
  differ("model_type", given.model_type, model.model_type);
  same("head_dim", given.head_dim, model.head_dim);
  same("the rotary dims", given.rotary_dim, model.rotary_dim);
  differ("rms_norm_eps", text(given.rms_norm_eps), text(model.rms_norm_eps));
  differ("rope_type", given.rope_type, model.rope_type);
  differ("rope_theta", text(given.rope_theta), text(model.rope_theta));
  differ("the sliding layers' rope_theta", text(given.sliding_rope_theta),
         text(model.sliding_rope_theta));
  differ("the RoPE scaling factor", text(given.rope_factor), text(model.rope_factor));
  differ("LongRoPE's long factors", list(given.rope_long_freq_factors),
         list(model.rope_long_freq_factors));
  same("the RoPE's original context", given.rope_original_max_position_embeddings,
       model.rope_original_max_position_embeddings);
  differ("the RoPE frequency factors", list(given.rope_freq_factors),
         list(model.rope_freq_factors));
  differ("the RoPE attention factor", text(static_cast<float>(given.rope_attention_factor)),
         text(static_cast<float>(model.rope_attention_factor)));
  differ("the layers' windows", windows(given), windows(model));
  std::string a_act, m_act;
  for (const auto& a : given.mlp_activations) a_act += a + " ";
  for (const auto& a : model.mlp_activations) m_act += a + " ";
  differ("the MLP activations", a_act, m_act);
  if (model.mlp_activations.size() > 0 && model.mlp_activations[0].rfind("clamped", 0) == 0) {
    differ("swiglu_limit", text(given.swiglu_limit), text(model.swiglu_limit));
    differ("swiglu_alpha", text(given.swiglu_alpha), text(model.swiglu_alpha));
  }
  auto flag = [&](const char* field, bool a, bool b) {
    differ(field, a ? "true" : "false", b ? "true" : "false");
  };
  flag("attention sinks", given.attention_sinks, model.attention_sinks);
  differ("the attention scale", text(given.attention_scale), text(model.attention_scale));
  differ("attn_logit_softcapping", text(given.attn_logit_softcapping),
         text(model.attn_logit_softcapping));
  differ("final_logit_softcapping", text(given.final_logit_softcapping),
         text(model.final_logit_softcapping));
  differ("embedding_multiplier", text(given.embedding_multiplier),
         text(model.embedding_multiplier));
  flag("zero-centered norms", given.zero_centered_norms, model.zero_centered_norms);
  flag("post-block norms", given.post_block_norms, model.post_block_norms);
  flag("qk_norm", given.qk_norm, model.qk_norm);
  flag("q/k norms over the heads", given.qk_norm_over_heads, model.qk_norm_over_heads);
  differ("clip_qkv", text(given.clip_qkv), text(model.clip_qkv));
  if (model.num_experts > 0) {
    flag("norm_topk_prob", given.norm_topk_prob, model.norm_topk_prob);
    flag("the router's bias", given.router_bias, model.router_bias);
  }
}

}  // namespace detail

namespace {

// The config text must describe `model`: its names decide which tensors are written (a tied head
// has no lm_head.weight) and how transformers builds the model.
void check_config(const CausalLMConfig& model, const std::string& config_json,
                  const std::string& dir) {
  const CausalLMConfig given = parse_causal_lm_config(config_json, dir + "/config.json");
  detail::check_same_sizes(given, model, "save_causal_lm: the config for '" + dir + "'");
}

}  // namespace

void save_causal_lm(const CausalLMImpl& model, const std::string& dir,
                    const std::string& config_json) {
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(config_json);
  } catch (const nlohmann::json::exception& e) {
    TE_FAIL("save_causal_lm: the config for '", dir, "' is not JSON (", e.what(), ")");
  }
  TE_CHECK(config.is_object(), "save_causal_lm: the config for '", dir, "' is not a JSON object");
  check_config(model.config, config_json, dir);
  const at::ScalarType dtype = model.parameters().at(0).scalar_type();
  const std::map<std::string, at::Tensor> whole = detail::whole_parameters(model, "save_causal_lm");
  detail::on_rank_zero([&] { write_files(model, dir, config, dtype, whole); });
}

}  // namespace te::hf
