// The mixture-of-experts decoders' config fields and weight map (moe_decoder.h), as
// transformers 5.23.0 defines them: models/qwen2_moe, qwen3_moe and mixtral (configuration_*.py
// for the fields and their defaults, modeling_*.py for the layers that are sparse).

#include "moe_decoder.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace te::hf::detail {

void read_moe_config(Fields& f, CausalLMConfig& c, const MoeFields& m) {
  // Qwen3-MoE's config class maps num_experts to num_local_experts, and save_pretrained writes
  // the latter; checkpoints on the Hub name the former.
  const bool local = f.has("num_local_experts");
  const bool named = f.has(m.experts);
  if (!local && !named) f.integer(m.experts);  // missing: the error names the field
  c.num_experts = named ? f.integer(m.experts) : f.integer("num_local_experts");
  if (local && named && f.integer("num_local_experts") != c.num_experts) {
    f.fail("num_local_experts", "differs from " + std::string(m.experts));
  }
  if (c.num_experts <= 0) {
    f.fail(named ? m.experts : "num_local_experts",
           std::to_string(c.num_experts) + " experts; te-cpp builds a mixture of at least one");
  }
  c.num_experts_per_tok = f.integer("num_experts_per_tok");
  if (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts) {
    f.fail("num_experts_per_tok", std::to_string(c.num_experts_per_tok) +
                                      " experts per token is not in [1, " +
                                      std::to_string(c.num_experts) + "] (the experts)");
  }
  c.layer_moe.assign(static_cast<std::size_t>(c.num_hidden_layers), true);
  if (m.qwen) {
    c.moe_intermediate_size = f.integer("moe_intermediate_size");
    c.norm_topk_prob = f.boolean_or("norm_topk_prob", false);
    const int64_t step = f.integer_or("decoder_sparse_step", 1);
    if (step <= 0) f.fail("decoder_sparse_step", "must be positive");
    std::vector<int64_t> dense;
    if (f.has("mlp_only_layers")) {
      const json& list = f.raw("mlp_only_layers");
      if (!list.is_array()) f.fail("mlp_only_layers", "expected a list of layer indices");
      for (const json& i : list) {
        if (!i.is_number_integer() || i.get<int64_t>() < 0 ||
            i.get<int64_t>() >= c.num_hidden_layers) {
          f.fail("mlp_only_layers", "entry " + i.dump() + " is not a layer index");
        }
        dense.push_back(i.get<int64_t>());
      }
    }
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      c.layer_moe[static_cast<std::size_t>(i)] =
          std::find(dense.begin(), dense.end(), i) == dense.end() && (i + 1) % step == 0;
    }
  } else {
    c.moe_intermediate_size = c.intermediate_size;
    // MixtralTopKRouter and GptOssTopKRouter always renormalise; OlmoeTopKRouter as told.
    c.norm_topk_prob = !m.norm_topk_prob_field || f.boolean_or("norm_topk_prob", false);
  }
  if (m.shared_expert) {
    c.shared_expert_intermediate_size = f.integer("shared_expert_intermediate_size");
  }
  c.router_aux_loss_coef = f.number_or("router_aux_loss_coef", m.aux_loss_coef);
  if (!(c.router_aux_loss_coef >= 0) || !std::isfinite(c.router_aux_loss_coef)) {
    f.fail("router_aux_loss_coef",
           "must be a finite number of at least 0 (the weight of the "
           "router's load-balancing loss)");
  }
  c.output_router_logits = f.boolean_or("output_router_logits", false);
}

namespace {

// A checkpoint tensor [out, in] transposed into the te kernel's entry `expert` (or the whole
// kernel, -1), into slot `slot` of its dim 1 when slot >= 0.
HfSource kernel_source(const std::string& name, int64_t expert, int64_t slot = -1) {
  HfSource s;
  s.name = name;
  s.expert = expert;
  s.slot_dim = slot >= 0 ? 1 : -1;
  s.slot = slot >= 0 ? slot : 0;
  s.transpose = true;
  return s;
}

// Layer `te`'s dense MLP entries of rope_decoder_weight_map taken out, its norm moved to the
// sparse block's.
void make_sparse(WeightMap& m, const std::string& te) {
  for (const char* dense : {"mlp.wi_kernel", "mlp.wo_kernel", "mlp.wi_bias", "mlp.wo_bias"}) {
    m.erase(te + dense);
  }
  m[te + "moe.layernorm.scale"] = m.at(te + "mlp.layernorm.scale");
  m.erase(te + "mlp.layernorm.scale");
}

// Slot `slot` of te's stacked dim `dim` from a fused tensor whose dim `dim` holds the `slots`
// slots of `length` entries each interleaved: entries slot, slot + slots, ... (gpt-oss's
// gate_up_proj).
HfSource interleaved_source(const std::string& name, int64_t dim, int64_t slot, int64_t slots,
                            int64_t length) {
  HfSource s;
  s.name = name;
  s.slot_dim = dim;
  s.slot = slot;
  s.narrow_dim = dim;
  s.narrow_start = slot;
  s.narrow_length = length;
  s.narrow_total = slots * length;
  s.narrow_step = slots;
  return s;
}

}  // namespace

WeightMap fused_experts_weight_map(const CausalLMConfig& c) {
  WeightMap m = rope_decoder_weight_map(c);
  const int64_t f = c.moe_intermediate_size;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string te = "layers." + std::to_string(i) + ".";
    const std::string hf = "model.layers." + std::to_string(i) + ".";
    if (!c.layer_moe.at(static_cast<std::size_t>(i))) continue;
    make_sparse(m, te);
    const std::string router = hf + "mlp.router.", experts = hf + "mlp.experts.";
    m[te + "moe.gate_kernel"] = {kernel_source(router + "weight", -1)};
    if (c.router_bias) m[te + "moe.gate_bias"] = {{router + "bias"}};
    // gate_up_proj [E, H, 2F] (in x out) into wi_kernel [E, H, 2, F]: gate from the even
    // columns, up from the odd ones; its bias [E, 2F] into wi_bias [E, 2, F] likewise.
    auto& wi = m[te + "moe.wi_kernel"];
    for (int64_t slot : {0, 1})
      wi.push_back(interleaved_source(experts + "gate_up_proj", 2, slot, 2, f));
    m[te + "moe.wo_kernel"] = {{experts + "down_proj"}};  // [E, F, H], as te's
    if (c.mlp_bias) {
      auto& wi_bias = m[te + "moe.wi_bias"];
      for (int64_t slot : {0, 1}) {
        wi_bias.push_back(interleaved_source(experts + "gate_up_proj_bias", 1, slot, 2, f));
      }
      m[te + "moe.wo_bias"] = {{experts + "down_proj_bias"}};
    }
  }
  return m;
}

WeightMap fused_experts_gguf_weight_map(const CausalLMConfig& c) {
  WeightMap m = fused_experts_weight_map(c);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (!c.layer_moe.at(static_cast<std::size_t>(i))) continue;
    const std::string te = "layers." + std::to_string(i) + ".";
    std::vector<HfSource> wi, wo, wi_bias, wo_bias;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const std::string expert =
          "model.layers." + std::to_string(i) + ".mlp.experts." + std::to_string(e) + ".";
      // [out, in] rows (held in their blocks where they are quantized), the gate in slot 0.
      wi.push_back(kernel_source(expert + "gate_proj.weight", e, 0));
      wi.push_back(kernel_source(expert + "up_proj.weight", e, 1));
      wo.push_back(kernel_source(expert + "down_proj.weight", e));
      for (const auto& [name, slot] : {std::pair{"gate_proj.bias", 0}, {"up_proj.bias", 1}}) {
        HfSource b;  // [F] into wi_bias[e] ([2, F]) at its slot
        b.name = expert + name;
        b.expert = e;
        b.slot_dim = 0;
        b.slot = slot;
        wi_bias.push_back(b);
      }
      HfSource b;
      b.name = expert + "down_proj.bias";
      b.expert = e;
      wo_bias.push_back(b);
    }
    m[te + "moe.wi_kernel"] = std::move(wi);
    m[te + "moe.wo_kernel"] = std::move(wo);
    if (c.mlp_bias) {
      m[te + "moe.wi_bias"] = std::move(wi_bias);
      m[te + "moe.wo_bias"] = std::move(wo_bias);
    }
  }
  return m;
}

const GgufNames& fused_experts_gguf() {
  static const GgufNames kNames = [] {
    GgufNames n = kRopeDecoderGguf;
    for (auto& [hf, gguf] : n.layer) {  // GPT_OSS has ATTN_POST_NORM where Llama has FFN_NORM
      if (hf == "post_attention_layernorm.weight") gguf = "post_attention_norm.weight";
    }
    n.layer.push_back({"self_attn.sinks", "attn_sinks.weight"});
    n.layer.push_back({"mlp.router.weight", "ffn_gate_inp.weight"});
    n.layer.push_back({"mlp.router.bias", "ffn_gate_inp.bias"});
    for (const std::string p : {"gate", "up", "down"}) {
      for (const std::string kind : {"weight", "bias"}) {
        n.experts.push_back(
            {"mlp.experts.", "." + p + "_proj." + kind, "ffn_" + p + "_exps." + kind});
      }
    }
    return n;
  }();
  return kNames;
}

WeightMap moe_decoder_weight_map(const CausalLMConfig& c, const MoeNames& n) {
  WeightMap m = rope_decoder_weight_map(c);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (!c.layer_moe.at(static_cast<std::size_t>(i))) continue;
    const std::string te = "layers." + std::to_string(i) + ".";
    const std::string hf = "model.layers." + std::to_string(i) + ".";
    const std::string block = hf + n.block;
    make_sparse(m, te);
    m[te + "moe.gate_kernel"] = {kernel_source(block + "gate.weight", -1)};
    auto& wi = m[te + "moe.wi_kernel"];
    auto& wo = m[te + "moe.wo_kernel"];
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const std::string expert = block + "experts." + std::to_string(e) + ".";
      // Each expert's [hidden, 2, moe_intermediate] entry: gate in slot 0, up in slot 1.
      wi.push_back(kernel_source(expert + n.gate + ".weight", e, 0));
      wi.push_back(kernel_source(expert + n.up + ".weight", e, 1));
      wo.push_back(kernel_source(expert + n.down + ".weight", e));
    }
    if (c.shared_expert_intermediate_size > 0) {
      const std::string shared = block + "shared_expert.";
      m[te + "moe.shared_wi_kernel"] = {kernel_source(shared + "gate_proj.weight", -1, 0),
                                        kernel_source(shared + "up_proj.weight", -1, 1)};
      m[te + "moe.shared_wo_kernel"] = {kernel_source(shared + "down_proj.weight", -1)};
      m[te + "moe.shared_gate_kernel"] = {kernel_source(block + "shared_expert_gate.weight", -1)};
    }
  }
  return m;
}

void read_moe_gguf(GgufKeys& k, CausalLMConfig& c, const MoeGguf& m) {
  auto positive = [&](const std::string& key, std::optional<int64_t> v) {
    if (!v || *v <= 0) k.fail(key, "is missing or not positive; a mixture of experts needs it");
    return *v;
  };
  c.num_experts = positive("expert_count", k.integer("expert_count"));
  c.num_experts_per_tok = positive("expert_used_count", k.integer("expert_used_count"));
  if (c.num_experts_per_tok > c.num_experts) {
    k.fail("expert_used_count", std::to_string(c.num_experts_per_tok) + " is more than the " +
                                    std::to_string(c.num_experts) + " experts");
  }
  const auto expert_length = k.integer("expert_feed_forward_length");
  if (m.ffn_length_required && !expert_length) {
    k.fail("expert_feed_forward_length", "is missing; this architecture's experts need it");
  }
  c.moe_intermediate_size =
      m.ffn_length ? c.intermediate_size
                   : positive("expert_feed_forward_length",
                              expert_length.value_or(c.intermediate_size / c.num_experts_per_tok));
  if (m.shared) {
    c.shared_expert_intermediate_size =
        positive("expert_shared_feed_forward_length",
                 k.integer("expert_shared_feed_forward_length").value_or(c.intermediate_size));
  }
  c.norm_topk_prob = m.renormalise;
  c.layer_moe.assign(static_cast<std::size_t>(c.num_hidden_layers), true);
  c.router_aux_loss_coef = 0.001;  // the config classes' default: GGUF keeps no training field
}

const GgufNames& mixtral_gguf() {
  static const GgufNames kNames = [] {
    GgufNames n = kRopeDecoderGguf;
    n.layer.push_back({"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"});
    for (const auto& [w, g] :
         {std::pair<const char*, const char*>{"w1", "gate"}, {"w3", "up"}, {"w2", "down"}}) {
      n.experts.push_back({"block_sparse_moe.experts.", std::string(".") + w + ".weight",
                           std::string("ffn_") + g + "_exps.weight"});
    }
    return n;
  }();
  return kNames;
}

const GgufNames& experts_gguf() {
  // Built on first use: kRopeDecoderGguf is another file's global.
  static const GgufNames kNames = [] {
    GgufNames n = kRopeDecoderGguf;
    n.layer.push_back({"mlp.gate.weight", "ffn_gate_inp.weight"});
    for (const char* p : {"gate", "up", "down"}) {
      n.layer.push_back({std::string("mlp.shared_expert.") + p + "_proj.weight",
                         std::string("ffn_") + p + "_shexp.weight"});
      n.experts.push_back({"mlp.experts.", std::string(".") + p + "_proj.weight",
                           std::string("ffn_") + p + "_exps.weight"});
    }
    n.layer.push_back({"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"});
    n.one_row.insert("mlp.shared_expert_gate.weight");
    return n;
  }();
  return kNames;
}

}  // namespace te::hf::detail
