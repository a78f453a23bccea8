#include "te/hf/causal_lm.h"

#include <ATen/ATen.h>

#include "te/distributed.h"
#include "te/error.h"
#include "te/nn/context_parallel.h"
#include "te/nn/functional.h"
#include "te/nn/random.h"

namespace te::hf {

namespace nn = te::nn;

nn::TransformerLayerOptions layer_options(const CausalLMConfig& c, int64_t layer) {
  // Llama's decoder layer as TE's TransformerLayer: pre-RMSNorm self attention (causal, RoPE on
  // the first rotary dims of each head, logits scaled by 1/sqrt(head_dim)) and a SwiGLU MLP
  // (silu(x W_gate) * x W_up, then W_down), no dropout on the residuals. GPT-2's: pre-LayerNorm,
  // biases everywhere, the fused c_attn, a gelu MLP, dropouts (learned positions: CausalLMImpl).
  auto o = nn::TransformerLayerOptions(c.hidden_size, c.intermediate_size, c.num_attention_heads)
               .layer_type("encoder")
               .mlp_activations(c.mlp_activations)
               .activation_params({c.swiglu_limit, c.swiglu_alpha, 1.0})
               .hidden_dropout(c.hidden_dropout)
               .intermediate_dropout(0)
               .mlp_bias(c.mlp_bias);
  nn::MultiHeadAttentionOptions& attention = o.self_attention();
  attention.use_bias(c.attention_bias)
      .qkv_bias(c.qkv_bias)
      .fuse_qkv(c.fuse_qkv)
      .scaled_query_init(false)
      .scale_attn_logits(true);
  attention.layernorm()
      .layernorm_type(c.norm)
      .epsilon(c.rms_norm_eps)
      .zero_centered_gamma(c.zero_centered_norms);
  // Gemma's query_pre_attn_scalar^-0.5 and attention soft cap (transformers 5.23.0
  // models/gemma2/modeling_gemma2.py Gemma2Attention); its post-attention and post-feedforward
  // norms (Gemma2DecoderLayer).
  attention.attention()
      .num_gqa_groups(c.num_key_value_heads)
      .head_dim(c.head_dim)
      .attn_mask_type(c.packed_sequences ? nn::AttnMaskType::kPaddingCausal
                                         : nn::AttnMaskType::kCausal)
      .attention_dropout(c.attention_dropout)
      .scale_factor(c.attention_scale)
      .softcap(c.attn_logit_softcapping);
  if (c.packed_sequences) attention.attention().qkv_format(nn::QkvFormat::kThd);
  if (c.attention_sinks) attention.attention().softmax_type(nn::SoftmaxType::kLearnable);
  attention.clip_qkv(c.clip_qkv);
  if (c.cp_comm_type) {
    attention.attention().cp_comm_type(*c.cp_comm_type).cp_load_balanced(c.cp_load_balanced);
  }
  o.post_block_layernorm(c.post_block_norms);
  if (c.num_experts > 0 && layer < static_cast<int64_t>(c.layer_moe.size()) &&
      c.layer_moe[static_cast<std::size_t>(layer)]) {
    // transformers' sparse block (Qwen2MoeSparseMoeBlock, Qwen3MoeSparseMoeBlock,
    // MixtralSparseMoeBlock, GptOssMLP at 5.23.0): softmax over the experts, its top k,
    // renormalised over those when norm_topk_prob, which is the softmax of the top k logits (TE's
    // use_pre_softmax false; GptOssTopKRouter's topk then softmax); else the top k of the softmax
    // over all (use_pre_softmax true).
    auto moe = nn::LayerNormMoEOptions(c.hidden_size, c.moe_intermediate_size, c.num_experts)
                   .activations(c.mlp_activations)
                   .activation_params({c.swiglu_limit, c.swiglu_alpha, 1.0})
                   .use_bias(c.mlp_bias)
                   .router_bias(c.router_bias)
                   .shared_expert_size(c.shared_expert_intermediate_size)
                   .shared_expert_gate(c.shared_expert_intermediate_size > 0);
    moe.router().topk = c.num_experts_per_tok;
    moe.router().use_pre_softmax = !c.norm_topk_prob;
    o.moe(moe);
  }
  // transformers' sliding window W: a query sees the W keys up to and including itself.
  TE_CHECK(layer >= 0 && layer < static_cast<int64_t>(c.layer_windows.size()),
           "layer_options: ", "layer ", layer, " of a config with ", c.layer_windows.size(),
           " layer windows");
  const auto& window = c.layer_windows[static_cast<std::size_t>(layer)];
  if (window) attention.attention().window_size(nn::WindowSize{*window - 1, 0});
  if (c.qk_norm) {
    attention.qk_norm_type(nn::QkNormType::kRMSNorm)
        .qk_norm_over_heads(c.qk_norm_over_heads)
        .qk_norm_eps(c.rms_norm_eps)
        .qk_norm_before_rope(true)
        .qk_norm_zero_centered_gamma(c.zero_centered_norms);
  }
  return o;
}

CausalLMImpl::CausalLMImpl(const CausalLMConfig& config_) : config(config_) { reset(); }

void CausalLMImpl::reset() {
  const CausalLMConfig& c = config;
  TE_CHECK(static_cast<int64_t>(c.layer_windows.size()) == c.num_hidden_layers,
           "CausalLM: the config has ", c.layer_windows.size(), " layer windows for ",
           c.num_hidden_layers, " layers; build the config with parse_causal_lm_config");
  embed = register_module(
      "embed", nn::Embedding(nn::EmbeddingOptions(c.vocab_size, c.hidden_size)
                                 .padding_idx(c.pad_token_id)
                                 .output_axes({axis::kBatch, axis::kSeqlen, axis::kHidden})));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers->push_back(nn::TransformerLayer(layer_options(c, i)));
  }
  if (c.positions == "learned") {
    position = register_module(
        "position", nn::Embedding(nn::EmbeddingOptions(c.max_position_embeddings, c.hidden_size)
                                      .embedding_axes({"position", axis::kEmbed})
                                      .output_axes({axis::kBatch, axis::kSeqlen, axis::kHidden})));
  }
  norm = register_module("norm", nn::LayerNorm(nn::LayerNormOptions(c.hidden_size)
                                                   .layernorm_type(c.norm)
                                                   .epsilon(c.rms_norm_eps)
                                                   .zero_centered_gamma(c.zero_centered_norms)));
  if (!c.tie_word_embeddings) {
    lm_head = register_module(
        "lm_head", nn::Dense(nn::DenseOptions(c.hidden_size, c.vocab_size)
                                 .use_bias(false)
                                 .kernel_axes({axis::kEmbed, axis::kVocab})
                                 .output_axes({axis::kBatch, axis::kSeqlen, axis::kVocab})));
  }
  if (c.positions != "rope") return;
  auto rope_options =
      nn::RotaryPositionEmbeddingOptions(c.rotary_dim == 0 ? c.head_dim : c.rotary_dim)
          .rotary_base(c.rope_theta);
  // transformers' linear scaling divides every position by the factor; TE's does so up to
  // pretrained * factor positions (then scales dynamically), so pretrained is set to
  // max_position_embeddings and longer sequences are refused in forward.
  if (c.rope_type == "linear") {
    TE_CHECK(c.max_position_embeddings > 0,
             "CausalLM: linear RoPE scaling needs "
             "max_position_embeddings in the config");
    rope_options.seq_len_interpolation_factor(c.rope_factor)
        .pretrained_max_position_embeddings(c.max_position_embeddings);
  }
  rope_options.frequency_factors(c.rope_freq_factors).attention_factor(c.rope_attention_factor);
  if (!c.rope_long_freq_factors.empty()) {  // LongRoPE: past the original length, the long set
    rope_options.long_frequency_factors(c.rope_long_freq_factors)
        .pretrained_max_position_embeddings(c.rope_original_max_position_embeddings);
  }
  rope = register_module("rope", nn::RotaryPositionEmbedding(rope_options));
  if (c.sliding_rope_theta > 0) {  // Gemma3RotaryEmbedding's sliding_attention (5.23.0)
    sliding_rope = register_module(
        "sliding_rope",
        nn::RotaryPositionEmbedding(nn::RotaryPositionEmbeddingOptions(rope_options.dim())
                                        .rotary_base(c.sliding_rope_theta)));
  }
}

void CausalLMImpl::pretty_print(std::ostream& stream) const {
  stream << "te::hf::CausalLM(" << config.model_type << ", layers=" << config.num_hidden_layers
         << ", hidden=" << config.hidden_size << ", heads=" << config.num_attention_heads
         << ", kv_heads=" << config.num_key_value_heads << ", vocab=" << config.vocab_size
         << (config.tie_word_embeddings ? ", tied" : "") << ")";
}

namespace {

// The last new token of each of the cache step's sequences, [1, tokens, hidden] -> [1, batch,
// hidden]: only they need the head.
at::Tensor last_tokens(const at::Tensor& x, const at::Tensor& rows) {
  return x.index_select(1, rows);
}
DTensor last_tokens(const DTensor& x, const at::Tensor& rows) {
  for (const Placement& p : x.placements()) {
    TE_CHECK(!is_shard(p, 1),
             "CausalLM::step: the tokens are split over the mesh (sequence "
             "parallel); generation takes them whole");
  }
  std::vector<int64_t> shape = x.sizes();
  shape[1] = rows.numel();
  return DTensor::from_local(x.to_local().index_select(1, rows.to(x.to_local().device())), x.mesh(),
                             x.placements(), shape);
}

// An element-wise map of activations, on a mesh of this rank's piece.
template <typename Fn>
at::Tensor each(const at::Tensor& x, const Fn& fn) {
  return fn(x);
}
template <typename Fn>
DTensor each(const DTensor& x, const Fn& fn) {
  return te::ops::elementwise(x, fn);
}

// Gemma's embedding normalizer (transformers 5.23.0 models/gemma2/modeling_gemma2.py
// Gemma2TextScaledWordEmbedding: the multiplier cast to the embeddings' dtype first).
template <typename T>
T scaled_embeddings(const T& x, double multiplier) {
  if (multiplier == 1.0) return x;
  return each(x, [multiplier](const at::Tensor& t) {
    return t * at::scalar_tensor(multiplier, t.options().dtype(at::kFloat)).to(t.scalar_type());
  });
}

// Gemma 2's final_logit_softcapping (Gemma2ForCausalLM.forward): cap * tanh(logits / cap).
template <typename T>
T soft_capped(const T& logits, double cap) {
  if (cap == 0.0) return logits;
  return each(logits, [cap](const at::Tensor& t) { return nn::functional::soft_cap(t, cap); });
}

// The forward: the whole sequences, or with a cache the step's new tokens (then the logits of
// each sequence's last one).
// Packed sequences (forward_packed): where each starts, the longest, each token's position.
struct Packing {
  at::Tensor cu_seqlens, cu_seqlens_padded;  // [sequences + 1], or [rows, sequences + 1]
  int64_t max_seqlen = 0, positions_needed = 0;
  at::Tensor positions;  // [rows, tokens]
  at::Tensor slots;      // each row's slots [rows, sequences + 1] (rank-ordering the positions)
};

template <typename T>
T run(CausalLMImpl& m, const T& ids, int64_t batch, int64_t seq, nn::InferenceParams* cache,
      const Packing* packed = nullptr) {
  const CausalLMConfig& c = m.config;
  TE_CHECK(c.packed_sequences == (packed != nullptr), "CausalLM: a model built ",
           c.packed_sequences ? "for packed sequences (CausalLMConfig::packed_sequences) takes "
                                "them through forward_packed"
                              : "for whole rows takes packed sequences only when built with "
                                "CausalLMConfig::packed_sequences (LoadOptions::packed_sequences)");
  // Positions: 0 ... seq-1, or with a cache each new token's place in its sequence, or each packed
  // sequence's own.
  const int64_t positions_needed = packed  ? packed->positions_needed
                                   : cache ? cache->max_seqlen_kv()
                                           : seq;
  at::Tensor positions;
  if (m.position) {
    if (packed) {
      positions = cp_token_order(c, packed->positions, packed->slots);
    } else if (cache) {
      positions = at::empty({1, seq}, at::kLong);
      const auto* cu = cache->cu_seqlens_q().data_ptr<int64_t>();
      const auto* pre = cache->pre_step_seqlens().data_ptr<int64_t>();
      auto* p = positions.data_ptr<int64_t>();
      for (int64_t i = 0; i < cache->batch_size(); ++i) {
        for (int64_t t = cu[i]; t < cu[i + 1]; ++t) p[t] = pre[i] + t - cu[i];
      }
    } else {
      positions = cp_token_order(c, at::arange(seq, at::kLong).expand({batch, seq}).contiguous());
    }
  }
  T x = scaled_embeddings(m.embed(ids), c.embedding_multiplier);
  if (m.position) {  // learned positions (GPT-2)
    TE_CHECK(positions_needed <= c.max_position_embeddings, "CausalLM: ", positions_needed,
             " tokens are more than the model's ", c.max_position_embeddings, " positions");
    namespace F = nn::functional;
    x = F::dropout(F::add(x, m.position(F::laid_out_like(ids, positions))), c.embedding_dropout,
                   m.is_training());
  }
  TE_CHECK(
      c.rope_type != "linear" || static_cast<double>(positions_needed) <=
                                     static_cast<double>(c.max_position_embeddings) * c.rope_factor,
      "CausalLM: ", positions_needed, " positions are more than linear RoPE scaling covers (",
      c.max_position_embeddings, " x factor ", c.rope_factor,
      "); transformers would extrapolate there, te-cpp refuses");
  nn::AttentionArgs args, sliding_args;  // the sliding layers' own RoPE where there is one
  if (m.rope) {
    args.rotary_pos_emb(m.rope->forward(positions_needed))
        .rotary_attention_factor(c.rope_attention_factor);
  }
  args.inference_params(cache);
  if (packed) {
    args.cu_seqlens_q(packed->cu_seqlens)
        .cu_seqlens_kv(packed->cu_seqlens)
        .max_seqlen_q(packed->max_seqlen)
        .max_seqlen_kv(packed->max_seqlen);
    if (packed->cu_seqlens_padded.defined()) {
      args.cu_seqlens_q_padded(packed->cu_seqlens_padded)
          .cu_seqlens_kv_padded(packed->cu_seqlens_padded);
    }
  }
  if (m.sliding_rope) {
    sliding_args = args;
    sliding_args.rotary_pos_emb(m.sliding_rope->forward(positions_needed))
        .rotary_attention_factor(1.0);  // a default RoPE
  }
  int64_t layer_number = 0;
  for (const auto& layer : *m.layers) {
    const bool sliding = m.sliding_rope && c.layer_windows[static_cast<std::size_t>(layer_number)];
    nn::AttentionArgs& a = sliding ? sliding_args : args;
    a.layer_number(layer_number++);
    x = layer->as<nn::TransformerLayerImpl>()->forward(x, {}, {}, {}, a);
  }
  if (cache) {  // each sequence's last new token
    x = last_tokens(x, cache->cu_seqlens_q().slice(0, 1) - 1);
  }
  x = m.norm(x);
  return soft_capped(m.lm_head ? m.lm_head(x) : m.embed->attend(x), c.final_logit_softcapping);
}

}  // namespace

at::Tensor cp_token_order(const CausalLMConfig& config, const at::Tensor& rows,
                          const at::Tensor& slots) {
  namespace F = nn::functional;
  const int64_t cp = config.cp_comm_type ? F::cp_size_in_scope() : 1;
  if (cp == 1) return rows;
  if (!slots.defined()) return config.cp_load_balanced ? F::cp_rank_order(rows, 1, cp) : rows;
  TE_CHECK(rows.dim() == 2 && slots.dim() == 2 && slots.size(0) == rows.size(0),
           "cp_token_order: rows ", rows.sizes(), " and slots ", slots.sizes(),
           " are not [rows, tokens] and [rows, sequences + 1]");
  TE_CHECK(cp_load_balance_is_exact(config),
           "CausalLM: packed rows under context parallelism go in TE's thd order, and this model "
           "has dropout outside attention (embeddings or residuals), whose masks would follow "
           "the tokens there, not one process's; set those dropouts to 0, or train whole rows");
  std::vector<at::Tensor> out;
  for (int64_t r = 0; r < rows.size(0); ++r) {
    out.push_back(F::cp_rank_order_packed(rows[r], 0, slots[r], cp));
  }
  return at::stack(out);
}

at::Tensor CausalLMImpl::forward(const at::Tensor& ids) {
  TE_CHECK(ids.dim() == 2, "CausalLM: ids must be [batch, seq], got ", ids.sizes());
  return run(*this, ids, ids.size(0), ids.size(1), nullptr);
}

DTensor CausalLMImpl::forward(const DTensor& ids) {
  TE_CHECK(ids.dim() == 2, "CausalLM: ids must be [batch, seq], got ", ids.dim(), " dims");
  return run(*this, ids, ids.sizes()[0], ids.sizes()[1], nullptr);
}

namespace {

// The packing of `cu_seqlens` over `rows` of `tokens` (checked by the attention; here what RoPE
// and learned positions need): its longest sequence, each token's position in its own (in its
// slot: a row's padding after its last sequence counts on from that sequence's start).
Packing packing_of(const at::Tensor& cu_seqlens, const at::Tensor& cu_seqlens_padded, int64_t rows,
                   int64_t tokens) {
  const bool by_rows = cu_seqlens.defined() && cu_seqlens.dim() == 2;
  TE_CHECK(!cu_seqlens_padded.defined() ||
               (cu_seqlens.defined() && cu_seqlens_padded.sizes() == cu_seqlens.sizes()),
           "CausalLM::forward_packed: cu_seqlens_padded ", cu_seqlens_padded.sizes(),
           " is not the shape of cu_seqlens ",
           cu_seqlens.defined() ? cu_seqlens.sizes() : at::IntArrayRef{},
           ": one slot per sequence");
  TE_CHECK(by_rows ? cu_seqlens.size(0) == rows : rows == 1, "CausalLM::forward_packed: ids of ",
           rows, " rows with cu_seqlens ",
           cu_seqlens.defined() ? cu_seqlens.sizes() : at::IntArrayRef{},
           ": give ids [1, tokens] with cu_seqlens [sequences + 1], or ids [rows, tokens] with "
           "cu_seqlens [rows, sequences + 1]");
  namespace F = nn::functional;
  Packing p;
  p.cu_seqlens = cu_seqlens;
  p.cu_seqlens_padded = cu_seqlens_padded;
  p.positions = at::empty({rows, tokens}, at::kLong);
  at::Tensor starts;  // each slot's start, the last entry the end of the tokens
  if (by_rows) {
    const F::PackedRows r = F::packed_rows(cu_seqlens, cu_seqlens_padded, tokens, 0, rows,
                                           "CausalLM::forward_packed", "cu_seqlens");
    starts = r.cu_seqlens_padded;
    p.max_seqlen = r.max_seqlen;
    p.positions_needed = r.longest_slot;
  } else {
    const char* who = "CausalLM::forward_packed";
    starts = cu_seqlens_padded.defined()
                 ? F::checked_cu_seqlens(cu_seqlens_padded, who, "cu_seqlens_padded", tokens)
                 : F::checked_cu_seqlens(cu_seqlens, who, "cu_seqlens", tokens);
    const at::Tensor lengths =
        F::checked_cu_seqlens(cu_seqlens, who, "cu_seqlens", tokens, /*tail_padding=*/true).diff();
    p.max_seqlen = lengths.numel() ? lengths.max().item<int64_t>() : 0;
    const at::Tensor slot_lengths = starts.diff();
    p.positions_needed = slot_lengths.numel() ? slot_lengths.max().item<int64_t>() : 0;
  }
  const int64_t* c = starts.data_ptr<int64_t>();
  int64_t* pos = p.positions.data_ptr<int64_t>();
  for (int64_t i = 0; i + 1 < starts.size(0); ++i) {
    for (int64_t t = c[i]; t < c[i + 1]; ++t) pos[t] = t - c[i];
  }
  const at::Tensor& slots = cu_seqlens_padded.defined() ? cu_seqlens_padded : cu_seqlens;
  p.slots = by_rows ? slots : slots.unsqueeze(0);
  return p;
}

}  // namespace

at::Tensor CausalLMImpl::forward_packed(const at::Tensor& ids, const at::Tensor& cu_seqlens,
                                        const at::Tensor& cu_seqlens_padded) {
  TE_CHECK(ids.dim() == 2,
           "CausalLM::forward_packed: ids must be [1, tokens] or [rows, tokens], got ",
           ids.sizes());
  const Packing p = packing_of(cu_seqlens, cu_seqlens_padded, ids.size(0), ids.size(1));
  return run(*this, ids, ids.size(0), ids.size(1), nullptr, &p);
}

DTensor CausalLMImpl::forward_packed(const DTensor& ids, const at::Tensor& cu_seqlens,
                                     const at::Tensor& cu_seqlens_padded) {
  TE_CHECK(ids.dim() == 2,
           "CausalLM::forward_packed: ids must be [1, tokens] or [rows, tokens], got ",
           ids.to_string());
  const Packing p = packing_of(cu_seqlens, cu_seqlens_padded, ids.sizes()[0], ids.sizes()[1]);
  return run(*this, ids, ids.sizes()[0], ids.sizes()[1], nullptr, &p);
}

DTensor CausalLMImpl::forward_on_mesh(const at::Tensor& ids) {
  const DeviceMesh* mesh = current_mesh();
  TE_CHECK(mesh != nullptr, "CausalLM::forward_on_mesh: no mesh in scope (open a MeshScope)");
  const std::vector<Placement> whole(static_cast<std::size_t>(mesh->ndim()), Replicate{});
  return forward(with_sharding_constraint(DTensor::distribute(ids, *mesh, whole),
                                          {axis::kBatch, axis::kSeqlen}));
}

}  // namespace te::hf

namespace te::hf {

namespace {
// LongRoPE rotates a forward by its longest sequence: the long factors once it is longer than
// the original length (transformers' dynamic_rope_update). transformers' generate keeps every
// key of a sequence under its own length's factors by recomputing the cache when the sequence
// first grows past that length (Phi3ForCausalLM.prepare_inputs_for_generation, 5.23.0); te's
// cache cannot recompute, so a step whose keys would mix the two sets is refused.
void check_long_rope_step(const CausalLMConfig& c, const nn::InferenceParams& cache) {
  if (c.rope_long_freq_factors.empty()) return;
  const int64_t original = c.rope_original_max_position_embeddings;
  const bool long_step = cache.max_seqlen_kv() > original;
  const auto* pre = cache.pre_step_seqlens().data_ptr<int64_t>();
  const auto* after = cache.seqlens_kv().data_ptr<int64_t>();
  const auto& ids = cache.sequence_ids();
  for (int64_t i = 0; i < cache.batch_size(); ++i) {
    TE_CHECK((after[i] > original) == long_step, "CausalLM::step: LongRoPE rotates a step by its ",
             "longest sequence (", cache.max_seqlen_kv(), " tokens), and sequence ",
             ids[static_cast<std::size_t>(i)], " (", after[i],
             " tokens) is on the other side of original_max_position_embeddings ", original,
             "; te-cpp's KV cache keeps each sequence under its own length's factors, so every "
             "sequence of a step must be on one side (te::gen::Engine keeps them all within it)");
  }
  for (int64_t i = 0; i < cache.batch_size(); ++i) {
    TE_CHECK(!long_step || pre[i] == 0 || pre[i] > original, "CausalLM::step: sequence ",
             ids[static_cast<std::size_t>(i)], " grows past original_max_position_embeddings ",
             original, " (LongRoPE) with its first ", pre[i],
             " keys cached under the short factors; transformers' generate recomputes them under "
             "the long factors there, te-cpp's KV cache does not: keep each sequence within ",
             original, " tokens, or run a longer one's whole prompt in one step");
  }
}

void check_step(const CausalLMImpl& m, int64_t dims, int64_t tokens,
                const nn::InferenceParams& cache) {
  TE_CHECK(dims == 1, "CausalLM::step: ids must be the step's tokens packed [tokens], got ", dims,
           " dims");
  TE_CHECK(cache.batch_size() > 0 && tokens == cache.new_tokens(), "CausalLM::step: ", tokens,
           " ids for a cache step of ", cache.new_tokens(),
           " new tokens (call the cache's pre_step with each sequence's new-token count first)");
  TE_CHECK(!m.is_training(), "CausalLM::step: a KV cache is for inference; call eval() first");
  check_long_rope_step(m.config, cache);
}
}  // namespace

at::Tensor router_aux_loss(const CausalLMConfig& config, const std::vector<nn::RouterLoad>& loads) {
  if (!config.output_router_logits) return at::zeros({}, at::kFloat);
  TE_CHECK(!loads.empty(), "router_aux_loss: the config counts the router's load-balancing loss ",
           "(output_router_logits) but no layer's router load was recorded: the model has no "
           "sparse layer (every layer in mlp_only_layers?), or the forward ran outside a "
           "te::nn::RouterLoadScope; set output_router_logits false, or run the forward inside "
           "one");
  return nn::load_balancing_loss(loads) * config.router_aux_loss_coef;
}

nn::InferenceParamsOptions cache_options(const CausalLMConfig& c, int64_t max_batch_size,
                                         int64_t max_sequence_length) {
  const int64_t length = max_sequence_length ? max_sequence_length : c.max_position_embeddings;
  TE_CHECK(length > 0,
           "cache_options: the config has no max_position_embeddings; give "
           "max_sequence_length");
  return nn::InferenceParamsOptions(max_batch_size, length, c.num_key_value_heads, c.head_dim);
}

at::Tensor CausalLMImpl::step(const at::Tensor& ids, nn::InferenceParams& cache) {
  check_step(*this, ids.dim(), ids.dim() == 1 ? ids.size(0) : -1, cache);
  return run(*this, ids.unsqueeze(0), 1, ids.size(0), &cache).squeeze(0);
}

DTensor CausalLMImpl::step_on_mesh(const at::Tensor& ids, nn::InferenceParams& cache) {
  check_step(*this, ids.dim(), ids.dim() == 1 ? ids.size(0) : -1, cache);
  const DeviceMesh* mesh = current_mesh();
  TE_CHECK(mesh != nullptr, "CausalLM::step_on_mesh: no mesh in scope (open a MeshScope)");
  const std::vector<Placement> whole(static_cast<std::size_t>(mesh->ndim()), Replicate{});
  const DTensor logits =
      run(*this, DTensor::distribute(ids.unsqueeze(0), *mesh, whole), 1, ids.size(0), &cache);
  return nn::functional::select(logits, 0, 0);
}

}  // namespace te::hf
