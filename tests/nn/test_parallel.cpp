// The equivalence matrix: {Dense column- and row-parallel, LayerNormMLP gelu and gated, attention,
// encoder and decoder layers} x {DP2, FSDP2, TP2, TP2+SP, DP2xTP2, TP4, FSDP2xTP2, DP2xFSDP2 (batch
// over the tuple)} x {TE table from the MeshResource, user rules extended with TE's, custom axis
// names in the kernels}, plus an uneven batch and sequence (3 x 5) on DP2, TP2+SP and DP2xTP2:
// outputs and the gradients of the input and of every parameter equal one process within 1e-5.
// Context parallelism: the kinds whose attention takes it (causal, GQA with RoPE, a soft-capped
// sliding window where the strategy allows one, padding masks, the encoder, decoder, parallel
// and sandwich layers; not ALiBi, arbitrary masks or learnable sinks) x {CP2, DP2xCP2, TP2xCP2,
// CP4} x {p2p, all_gather, a2a}, input split over seqlen_cp, TE's table only (the rule variants
// test rule resolution, which the layouts above cover), with dropout, and bf16 on CP2.
// Mixtures of experts (a LayerNormMoE block, and a causal layer with one as its MLP) on DP2, FSDP2,
// TP2, TP2+SP, DP2xTP2 and expert parallel (EP2 by all-to-all, DP2xEP2, EP2xTP2), with dropout,
// and in bf16 on the expert-parallel layouts.
// Ranks are threads with their own Gloo groups. The modules with dropout run the matrix a second
// time in training mode with rates 0.1-0.3: te's dropout draws each element's mask from its global
// position, so every layout still matches.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <functional>
#include <map>
#include <mutex>

#include "../cpu_autocast.h"
#include "../distributed/dist_test_util.h"
#include "../expect_error.h"
#include "matrix_layouts.h"
#include "te/nn.h"

namespace te::nn {
namespace {

namespace F = functional;
using test::piece_of;

using Layout = test::MatrixLayout;
const std::vector<Layout>& layouts() { return test::matrix_layouts(); }
const Layout& layout_named(const std::string& name) {
  for (const auto* list :
       {&test::matrix_layouts(), &test::cp_matrix_layouts(), &test::ep_matrix_layouts()}) {
    for (const Layout& l : *list) {
      if (l.name == name) return l;
    }
  }
  throw std::runtime_error("no matrix layout " + name);
}

enum class Way { kTeTable, kExtendedRules, kCustomNames };
enum class Kind {
  kDenseColumn,
  kDenseRow,
  kMlpGelu,
  kMlpGated,
  kMhaFused,
  kMhaGqa,        // Llama's attention: GQA, padding_causal, RoPE (half rotation)
  kMhaWindow,     // padding_causal_bottom_right with a sliding window and ALiBi: per-sequence
                  // diagonals
  kMhaArbitrary,  // a per-head arbitrary mask, a per-head post-scale bias and learnable sinks:
                  // their heads shard with the heads
  kEncoder,       // BERT's post-LN layer (output_layernorm, residuals from the norms), drop path
  kDecoder,       // causal self and cross attention, interleaved RoPE (GPT-J's), RMSNorm qk-norm,
                  // swiglu
  kParallel,      // parallel attention and MLP, L2 qk-norm, clamped_swiglu, drop path
  kSandwich,      // Gemma 2's layer: zero-centered RMSNorms before and after each block, a
                  // soft-capped causal window attention with RoPE, GeGLU
  kMhaCpRope,     // context parallelism's cases: GQA, causal, RoPE (te's fused kernel)
  kMhaCpWindow,   // GQA, a soft-capped causal sliding window (the unfused blocks)
  kMhaCpThd,      // rows of packed sequences (thd), GQA, padding_causal, RoPE per sequence: under
                  // cp the tokens in TE's layout (each rank chunks r and 2·cp-1-r of each slot)
  kMoe,           // LayerNormMoE: 4 experts, top 2, biases, a router bias, a gated shared expert
  kMoeDecoder,    // a causal decoder layer whose MLP is that mixture of experts
};

// Rules mapping the custom kernel names onto the layout's mesh axes.
AxisRules custom_rules(const MeshResource& r) {
  AxisRules rules;
  MeshAxes batch;
  if (r.dp) batch.push_back(*r.dp);
  if (r.fsdp) batch.push_back(*r.fsdp);
  rules.push_back({"batch", batch});
  const auto tensor = r.tpsp ? r.tpsp : r.tp;
  rules.push_back({"seqlen_tp", r.tpsp ? MeshAxes{*r.tpsp} : MeshAxes{}});
  rules.push_back({"embed", r.fsdp ? MeshAxes{*r.fsdp} : MeshAxes{}});
  rules.push_back({"mlp", tensor ? MeshAxes{*tensor} : MeshAxes{}});
  rules.push_back({"act", {}});
  rules.push_back({"hidden_tp", tensor ? MeshAxes{*tensor} : MeshAxes{}});
  rules.push_back({"heads", tensor ? MeshAxes{*tensor} : MeshAxes{}});
  return rules;
}

struct Model {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::function<DTensor(const DTensor&)> forward_d;
};

// The global input's batch and sequence: even (4 x 6), or uneven over two ranks (3 x 5: the
// batch splits 2 + 1, the sequence 3 + 2).
struct Shape {
  int64_t batch, seq;
};
Shape shape_of(bool uneven) { return uneven ? Shape{3, 5} : Shape{4, 6}; }
// Context parallel layouts split the sequence into 2 or 4 equal chunks.
Shape shape_of(bool uneven, const std::string& cp) {
  return cp.empty() ? shape_of(uneven) : Shape{4, 8};
}

// The thd kind's rows: sequences of (8, 5), (3, 8), (6, 1) and (8, 8) tokens in slots of 8 and 8.
Shape thd_shape() { return {4, 16}; }
const at::Tensor& thd_slots() {
  static const at::Tensor slots = at::tensor(std::vector<int64_t>{0, 8, 16});
  return slots;
}
AttentionArgs thd_args() {
  const at::Tensor cu = at::tensor(std::vector<int64_t>{0, 8, 13, 0, 3, 11, 0, 6, 7, 0, 8, 16});
  return AttentionArgs()
      .cu_seqlens_q(cu.view({4, 3}))
      .cu_seqlens_kv(cu.view({4, 3}))
      .cu_seqlens_q_padded(thd_slots().repeat({4, 1}))
      .cu_seqlens_kv_padded(thd_slots().repeat({4, 1}));
}
// The thd kind's tokens in every cp rank's order (each rank's TE-layout chunks), and back.
at::Tensor thd_rank_order(const at::Tensor& t, int64_t cp) {
  std::vector<at::Tensor> ranks;
  for (int64_t r = 0; r < cp; ++r) ranks.push_back(F::cp_shard_packed(t, 1, thd_slots(), cp, r));
  return at::cat(ranks, 1);
}

// RoPE frequencies for the 4-dim heads (base 100: angles that turn within 6 positions).
at::Tensor rope(Shape sh, bool interleaved) {
  return RotaryPositionEmbedding(
             RotaryPositionEmbeddingOptions(4).rotary_base(100.0).interleaved(interleaved))
      ->forward(sh.seq);
}

// Rows of lengths 6, 4, 5, 3 (cut to the shape), masked as TE's encoder masks them:
// [batch, 1, seqlen, seqlen], true where the key or the query is padding, so every layout also
// holds the padded query rows (no key left: zero probabilities) to one process.
at::Tensor padding_mask(Shape sh) {
  at::Tensor len = at::tensor(std::vector<int64_t>{6, 4, 5, 3})
                       .narrow(0, 0, sh.batch)
                       .clamp_max(sh.seq)
                       .view({-1, 1, 1, 1});
  return at::arange(sh.seq)
      .view({1, 1, 1, sh.seq})
      .ge(len)
      .logical_or(at::arange(sh.seq).view({1, 1, sh.seq, 1}).ge(len));
}

// Dropout rates of the second run (0 in the first).
struct Rates {
  double hidden = 0, attention = 0, intermediate = 0;
};
Rates rates(bool dropout) { return dropout ? Rates{0.1, 0.3, 0.2} : Rates{}; }

// The mixture-of-experts kinds (TE's table: the experts' dim on exp, the ep role).
Model make_moe(Kind kind, bool sp, const Rates& r) {
  const LogicalAxes act = {"batch", sp ? "seqlen_tp" : "seqlen", "hidden"};
  auto moe = LayerNormMoEOptions(16, 12, 4)
                 .activations({"silu", "linear"})
                 .use_bias(true)
                 .router_bias(true)
                 .shared_expert_size(8)
                 .shared_expert_gate(true)
                 .intermediate_dropout_rate(r.intermediate);
  moe.layernorm().layernorm_type("rmsnorm");
  moe.router().topk = 2;
  if (kind == Kind::kMoe) {
    moe.layernorm_input_axes(act).dot_1_input_axes({"batch", "seqlen", "hidden"}).output_axes(act);
    LayerNormMoE block(moe);
    set_parameter_from_global(*block, "wo_bias", at::linspace(-1, 1, 64).view({4, 16}));
    return {block.ptr(), [block](const at::Tensor& x) mutable { return block->forward(x); },
            [block](const DTensor& x) mutable { return block->forward(x); }};
  }
  auto options = TransformerLayerOptions(16, 24, 4).moe(moe).hidden_dropout(r.hidden);
  options.layer_type("encoder");
  options.self_attention().enable_sequence_parallel(sp).layernorm().layernorm_type("rmsnorm");
  options.self_attention().attention().attn_mask_type("causal").attention_dropout(r.attention);
  TransformerLayer layer(options);
  return {layer.ptr(), [layer](const at::Tensor& x) mutable { return layer(x); },
          [layer](const DTensor& x) mutable { return layer(x); }};
}

// `cp`: the attention's cp_comm_type (empty: none).
Model make(Kind kind, bool sp, Way way, bool dropout, Shape sh, const std::string& cp = "",
           bool balanced = false) {
  const Rates r = rates(dropout);
  const bool custom = way == Way::kCustomNames;
  const LogicalAxes act = {"batch", sp ? "seqlen_tp" : "seqlen", "hidden"};
  const LogicalAxes whole = {"batch", "seqlen", "hidden"};
  const LogicalAxes inner = {"batch", "seqlen", "hidden_tp"};
  const std::string w_in = custom ? "embed" : "w_fsdp";
  const std::string w_out = custom ? "mlp" : "w_tp";
  const std::string joined = custom ? "act" : "w_joined";
  Model m;
  switch (kind) {
    case Kind::kMoe:
    case Kind::kMoeDecoder:
      return make_moe(kind, sp, r);
    case Kind::kDenseColumn: {
      Dense d(DenseOptions(16, 12).kernel_axes({w_in, w_out}).bias_axes({w_out}).input_axes(whole));
      set_parameter_from_global(*d, "bias", at::linspace(-1, 1, 12));
      m = {d.ptr(), [d](const at::Tensor& x) mutable { return d->forward(x); },
           [d](const DTensor& x) mutable { return d->forward(x); }};
      break;
    }
    case Kind::kDenseRow: {
      Dense d(DenseOptions(16, 12).kernel_axes({w_out, w_in}).output_axes(act));
      set_parameter_from_global(*d, "bias", at::linspace(-1, 1, 12));
      m = {d.ptr(), [d](const at::Tensor& x) mutable { return d->forward(x); },
           [d](const DTensor& x) mutable { return d->forward(x); }};
      break;
    }
    case Kind::kMlpGelu:
    case Kind::kMlpGated: {
      auto options =
          LayerNormMLPOptions(16, 24)
              .activations(kind == Kind::kMlpGelu ? std::vector<std::string>{"gelu"}
                                                  : std::vector<std::string>{"gelu", "linear"})
              .intermediate_dropout_rate(r.intermediate)
              .use_bias(true)
              .kernel_axes_1({w_in, joined, w_out})
              .kernel_axes_2({w_out, w_in})
              .bias_axes_1({joined, w_out})
              .layernorm_input_axes(act)
              .dot_1_input_axes(whole)
              .dot_2_input_axes(inner)
              .output_axes(act);
      LayerNormMLP mlp(options);
      const int64_t slots = kind == Kind::kMlpGelu ? 1 : 2;
      set_parameter_from_global(*mlp, "wi_bias", at::linspace(-1, 1, slots * 24).view({slots, 24}));
      set_parameter_from_global(*mlp, "wo_bias", at::linspace(1, -1, 16));
      m = {mlp.ptr(), [mlp](const at::Tensor& x) mutable { return mlp->forward(x); },
           [mlp](const DTensor& x) mutable { return mlp->forward(x); }};
      break;
    }
    case Kind::kMhaFused:
    case Kind::kMhaGqa:
    case Kind::kMhaWindow:
    case Kind::kMhaArbitrary:
    case Kind::kMhaCpRope:
    case Kind::kMhaCpWindow:
    case Kind::kMhaCpThd: {
      auto options = [&] {
        auto made = MultiHeadAttentionOptions(16, 4)
                        .enable_sequence_parallel(sp)
                        .qkv_kernel_axes({w_in, joined, w_out})
                        .q_kernel_axes({w_in, w_out})
                        .kv_kernel_axes({w_in, joined, w_out})
                        .out_kernel_axes({w_out, w_in});
        made.attention().attention_dropout(r.attention);
        if (!cp.empty()) made.attention().cp_comm_type(cp).cp_load_balanced(balanced);
        return made;
      }();
      at::Tensor mask;
      AttentionArgs args;
      if (kind == Kind::kMhaGqa) {
        options.attention().num_gqa_groups(2).attn_mask_type("padding_causal");
        mask = padding_mask(sh);
        args.rotary_pos_emb(rope(sh, false));
      } else if (kind == Kind::kMhaWindow) {
        // Query and key lengths that differ per row, so every row's bottom-right diagonal has
        // its own offset (valid keys - valid queries: 2, -2, 2, -2).
        options.attention()
            .attn_mask_type("padding_causal_bottom_right")
            .window_size(WindowSize{2, 0});
        args.core_attention_bias_type("alibi");
        const auto lengths = [&](std::vector<int64_t> l) {
          return at::tensor(l).narrow(0, 0, sh.batch).clamp_max(sh.seq).view({-1, 1, 1, 1});
        };
        const at::Tensor lq = lengths({4, 6, 3, 5}), lk = lengths({6, 4, 5, 3});
        mask = at::arange(sh.seq)
                   .view({1, 1, 1, sh.seq})
                   .ge(lk)
                   .logical_or(at::arange(sh.seq).view({1, 1, sh.seq, 1}).ge(lq));
      } else if (kind == Kind::kMhaCpRope) {
        options.attention().num_gqa_groups(2).attn_mask_type("causal");
        args.rotary_pos_emb(rope(sh, false));
      } else if (kind == Kind::kMhaCpThd) {
        options.attention().num_gqa_groups(2).attn_mask_type("padding_causal").qkv_format("thd");
        args = thd_args().rotary_pos_emb(rope(sh, false));
      } else if (kind == Kind::kMhaCpWindow) {
        options.attention()
            .num_gqa_groups(2)
            .attn_mask_type("causal")
            .window_size(WindowSize{2, 0})
            .softcap(0.8);
      } else if (kind == Kind::kMhaArbitrary) {
        options.attention().attn_mask_type("arbitrary").softmax_type("learnable");
        mask = test::seeded_integers({sh.batch, 4, sh.seq, sh.seq}, 34).remainder(3).eq(0);
        args.core_attention_bias_type("post_scale_bias")
            .core_attention_bias(test::seeded_integers({1, 4, sh.seq, sh.seq}, 35).to(at::kFloat) /
                                 4.0);
      }
      MultiHeadAttention mha(options);
      if (kind == Kind::kMhaArbitrary) {
        set_parameter_from_global(*mha->attention, "softmax_offset", at::linspace(-1, 2, 4));
      }
      m = {
          mha.ptr(),
          [mha, mask, args](const at::Tensor& x) mutable { return mha(x, {}, mask, args); },
          [mha, mask, args](const DTensor& x) mutable { return mha(x, std::nullopt, mask, args); }};
      break;
    }
    case Kind::kEncoder:
    case Kind::kDecoder:
    case Kind::kParallel:
    case Kind::kSandwich: {
      const bool decoder = kind == Kind::kDecoder;
      auto options = TransformerLayerOptions(16, 24, 4);
      if (kind == Kind::kEncoder) {
        options.output_layernorm(true)
            .apply_residual_connection_post_layernorm(true)
            .mlp_activations({"gelu"});
      } else if (decoder) {
        options.mlp_activations({"swiglu"});
        options.self_attention().qk_norm_type("RMSNorm");
      } else if (kind == Kind::kSandwich) {
        options.post_block_layernorm(true).mlp_activations({"gelu", "linear"});
        options.self_attention().layernorm().layernorm_type("rmsnorm").zero_centered_gamma(true);
        options.self_attention().attention().softcap(0.8).window_size(WindowSize{2, 0});
      } else {
        options.parallel_attention_mlp(true)
            .mlp_activations({"clamped_swiglu"})
            .activation_params({1.5, 1.702, 1.0});
        options.self_attention().qk_norm_type("L2Normalization");
      }
      if (!decoder) options.drop_path_rate(r.hidden * 2);
      options.layer_type(decoder ? "decoder" : "encoder")
          .hidden_dropout(r.hidden)
          .intermediate_dropout(r.intermediate)
          .mlp_kernel_axes_1({w_in, joined, w_out})
          .mlp_kernel_axes_2({w_out, w_in});
      options.self_attention()
          .enable_sequence_parallel(sp)
          .rotary_pos_interleaved(kind == Kind::kDecoder)
          .qkv_kernel_axes({w_in, joined, w_out})
          .out_kernel_axes({w_out, w_in});
      options.self_attention()
          .attention()
          .attn_mask_type(decoder                   ? "causal"
                          : kind == Kind::kSandwich ? "padding_causal"
                                                    : "padding")
          .attention_dropout(r.attention);
      if (!cp.empty()) options.self_attention().attention().cp_comm_type(cp);
      TransformerLayer layer(options);
      // A norm scale other than one, so a residual taken before or after it differs.
      set_parameter_from_global(*layer->mlp->layernorm, "scale", at::linspace(0.5, 1.5, 16));
      if (layer->post_attention_layernorm) {
        set_parameter_from_global(*layer->post_attention_layernorm, "scale",
                                  at::linspace(-0.5, 0.5, 16));
        set_parameter_from_global(*layer->post_mlp_layernorm, "scale", at::linspace(0.3, -0.3, 16));
      }
      const at::Tensor mask = padding_mask(sh);
      if (!decoder) {
        AttentionArgs args;  // the sandwich rotates halves (Gemma's)
        if (kind == Kind::kSandwich) args.rotary_pos_emb(rope(sh, false));
        m = {layer.ptr(),
             [layer, mask, args](const at::Tensor& x) mutable {
               return layer(x, mask, {}, {}, args);
             },
             [layer, mask, args](const DTensor& x) mutable {
               return layer(x, mask, std::nullopt, {}, args);
             }};
      } else {
        const at::Tensor memory =
            test::seeded_integers({sh.batch, sh.seq, 16}, 33).to(at::kFloat) / 9.0;
        const at::Tensor freqs = rope(sh, true);
        m = {layer.ptr(),
             [layer, memory, mask, freqs](const at::Tensor& x) mutable {
               return layer(x, {}, memory.to(x.scalar_type()), mask,
                            AttentionArgs().rotary_pos_emb(freqs));
             },
             [layer, memory, mask, freqs](const DTensor& x) mutable {
               std::vector<Placement> whole(static_cast<std::size_t>(x.mesh().ndim()), Replicate{});
               return layer(
                   x, {},
                   DTensor::distribute(memory.to(x.to_local().scalar_type()), x.mesh(), whole),
                   mask, AttentionArgs().rotary_pos_emb(freqs));
             }};
      }
      break;
    }
  }
  return m;
}

// What one process computes: output and every gradient.
struct Reference {
  at::Tensor y, x_grad;
  std::map<std::string, at::Tensor> grads;
};

at::Tensor global_input(Shape sh) {
  return test::seeded_integers({sh.batch, sh.seq, 16}, 31).to(at::kFloat) / 7.0;
}
at::Tensor output_weight(Shape sh, int64_t width) {
  return test::seeded_integers({sh.batch, sh.seq, width}, 32).to(at::kFloat) / 5.0;
}

Reference reference(Kind kind, bool dropout, Shape sh, at::ScalarType dtype) {
  manual_seed(21);
  Model m = make(kind, false, Way::kTeTable, dropout, sh);  // (cp: one process attends whole)
  m.module->to(dtype);
  at::Tensor x = global_input(sh).to(dtype).requires_grad_(true);
  at::Tensor y = m.forward(x);
  (y * output_weight(sh, y.size(-1)).to(dtype)).sum().backward();
  Reference r{y.detach(), x.grad(), {}};
  for (const auto& p : m.module->named_parameters()) r.grads[p.key()] = p.value().grad();
  return r;
}

struct Case {
  Kind kind;
  std::string layout;
  Way way;
  bool dropout = false;
  bool uneven = false;
  at::ScalarType dtype = at::kFloat;
};

// How far a layout may move a result from one process's. fp32: 1e-5. bf16 and fp16 round every
// op's output to 8 (bf16) or 11 (fp16) significant bits; a layout rounds partial results at other
// points (per-rank partial sums rounded, then summed in fp32 and rounded again), so each op can
// differ by about two roundings, 2 * 2^-9 = 2^-8 relative for bf16. A module chains up to ~8 such
// ops (projections, softmax, products, residual adds), so 8 * 2^-8 = 2^-5 of the tensor's
// magnitude bounds bf16; fp16's 3 more bits make 2^-8.
double tolerance(at::ScalarType dtype) {
  if (dtype == at::kBFloat16) return 1.0 / 32;
  if (dtype == at::kHalf) return 1.0 / 256;
  return 1e-5;
}

// max |a - b| <= tol * max(1, max |b|), in fp32.
::testing::AssertionResult Near(const at::Tensor& a_in, const at::Tensor& b_in, double tol) {
  const at::Tensor a = a_in.to(at::kFloat), b = b_in.to(at::kFloat);
  if (a.sizes() != b.sizes()) {
    return ::testing::AssertionFailure() << "shapes " << a.sizes() << " vs " << b.sizes();
  }
  const double err = (a - b).abs().max().item<double>();
  const double scale = std::max(1.0, b.abs().max().item<double>());
  if (err <= tol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max abs error " << err << " > " << tol * scale << " (relative " << err / scale << ")";
}

class Equivalence : public ::testing::TestWithParam<Case> {};

TEST_P(Equivalence, OutputsAndEveryGradientMatchOneProcess) {
  const Case& c = GetParam();
  const Layout& layout = layout_named(c.layout);
  const Shape sh =
      c.kind == Kind::kMhaCpThd ? thd_shape() : shape_of(c.uneven, layout.cp_comm_type);
  const Reference ref = reference(c.kind, c.dropout, sh, c.dtype);
  // Packed sequences under cp: the tokens in every rank's order (identity without cp).
  int64_t cp = 1;
  for (std::size_t m = 0; m < layout.axes.size(); ++m) {
    const std::string& a = layout.axes[m];
    if (a == "cp" || a == "ring" || a == "a2a") cp *= layout.shape[m];
  }
  // (and the load-balanced layouts' tokens)
  const auto ranked = [&](const at::Tensor& t) {
    if (c.kind == Kind::kMhaCpThd && cp > 1) return thd_rank_order(t, cp);
    return layout.cp_load_balanced ? F::cp_rank_order(t, 1, cp) : t;
  };
  const auto whole = [&](const at::Tensor& t) {
    if (c.kind == Kind::kMhaCpThd && cp > 1) return F::cp_unshard_packed(t, 1, thd_slots(), cp);
    return layout.cp_load_balanced ? F::cp_unshard(t, 1, cp) : t;
  };
  const double tol = tolerance(c.dtype);
  set_warning_handler([](std::string_view) {});
  int64_t world = 1;
  for (int64_t s : layout.shape) world *= s;
  run_local_ranks(static_cast<int>(world), [&](int rank) {
    DeviceMesh mesh(layout.shape, layout.axes);
    MeshScope mesh_scope(mesh);
    const MeshResource resource =
        layout.mesh_resource.empty() ? MeshResource{} : parse_mesh_resource(layout.mesh_resource);
    MeshResourceScope resource_scope(resource);
    std::optional<AxisRulesScope> rules;
    if (!layout.rules.empty()) {
      rules.emplace(parse_axis_rules(layout.rules));
    } else if (c.way == Way::kExtendedRules) {
      rules.emplace(extend_logical_axis_rules(parse_axis_rules("vocab=,embed=")));
    } else if (c.way == Way::kCustomNames) {
      rules.emplace(custom_rules(resource));
    }
    manual_seed(21);
    Model m = make(c.kind, layout.sequence_parallel, c.way, c.dropout, sh, layout.cp_comm_type,
                   layout.cp_load_balanced);
    m.module->to(c.dtype);

    const LogicalAxes in_axes = {"batch",
                                 layout.sequence_parallel      ? "seqlen_tp"
                                 : layout.cp_comm_type.empty() ? "seqlen"
                                                               : "seqlen_cp",
                                 "hidden"};
    const auto in_placements = placements_for(*resolve_logical_axes(in_axes), mesh);
    at::Tensor x_local = piece_of(ranked(global_input(sh)).to(c.dtype), mesh, in_placements, rank)
                             .requires_grad_(true);
    DTensor x = DTensor::from_local(x_local, mesh, in_placements,
                                    std::vector<int64_t>{sh.batch, sh.seq, 16});
    DTensor y = m.forward_d(x);
    at::Tensor y_full = whole(y.full_tensor());
    ASSERT_EQ(y_full.scalar_type(), c.dtype);
    ASSERT_TRUE(Near(y_full, ref.y, tol)) << "rank " << rank;
    {
      // Half the cases sum data-parallel gradients in buckets after backward.
      std::optional<GradientBuckets> buckets;
      if (c.way == Way::kExtendedRules) buckets.emplace(256);  // small: several buckets
      (y_full * output_weight(sh, y_full.size(-1)).to(c.dtype)).sum().backward();
      if (buckets) buckets->finish();
    }
    EXPECT_TRUE(Near(x_local.grad(), piece_of(ranked(ref.x_grad), mesh, in_placements, rank), tol))
        << "input gradient on rank " << rank;

    const auto param_layouts = named_parameter_layouts(*m.module);
    bool any_sharded = false;
    for (const auto& p : m.module->named_parameters()) {
      const ParameterLayout& pl = param_layouts.at(p.key());
      const at::Tensor want = pl.mesh ? piece_of(ref.grads.at(p.key()), mesh, pl.placements, rank)
                                      : ref.grads.at(p.key());
      any_sharded = any_sharded || p.value().sizes() != ref.grads.at(p.key()).sizes();
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      EXPECT_EQ(p.value().grad().scalar_type(), c.dtype) << p.key();
      EXPECT_TRUE(Near(p.value().grad(), want, tol)) << p.key() << " on rank " << rank;
    }
    // Data and context parallel keep whole weights; tensor, expert parallel and FSDP shard some.
    EXPECT_EQ(any_sharded, layout.name.find("TP") != std::string::npos ||
                               layout.name.find("FSDP") != std::string::npos ||
                               layout.name.find("EP") != std::string::npos)
        << layout.name;
  });
  set_warning_handler(nullptr);
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (Kind kind : {Kind::kDenseColumn, Kind::kDenseRow, Kind::kMlpGelu, Kind::kMlpGated,
                    Kind::kMhaFused, Kind::kMhaGqa, Kind::kMhaWindow, Kind::kMhaArbitrary,
                    Kind::kEncoder, Kind::kDecoder, Kind::kParallel, Kind::kSandwich}) {
    for (const Layout& l : layouts()) {
      // 2 key/value heads do not split over 4 ranks (GqaHeadsMustSplitEvenly below).
      if (kind == Kind::kMhaGqa && l.name == "TP4") continue;
      for (Way way : {Way::kTeTable, Way::kExtendedRules, Way::kCustomNames}) {
        cases.push_back({kind, l.name, way});
        if (kind != Kind::kDenseColumn && kind != Kind::kDenseRow) {
          cases.push_back({kind, l.name, way, true});
        }
      }
      // bf16 and fp16 on every base layout.
      if (l.name == "DP2" || l.name == "FSDP2" || l.name == "TP2" || l.name == "TP2SP" ||
          l.name == "DP2xTP2") {
        cases.push_back({kind, l.name, Way::kTeTable, false, false, at::kBFloat16});
        cases.push_back({kind, l.name, Way::kTeTable, false, false, at::kHalf});
      }
      // Batch and sequence that two ranks split unevenly (torch.chunk pieces of 2 + 1, 3 + 2).
      if (l.name == "DP2" || l.name == "TP2SP" || l.name == "DP2xTP2") {
        cases.push_back({kind, l.name, Way::kTeTable, false, true});
        if (kind != Kind::kDenseColumn && kind != Kind::kDenseRow) {
          cases.push_back({kind, l.name, Way::kTeTable, true, true});
        }
      }
    }
  }
  // Mixtures of experts, TE's table: on the base layouts, and expert parallel (EP2 by all-to-all,
  // DP2xEP2, EP2xTP2), with dropout and in bf16.
  for (Kind kind : {Kind::kMoe, Kind::kMoeDecoder}) {
    for (const std::string l :
         {"DP2", "FSDP2", "TP2", "TP2SP", "DP2xTP2", "EP2", "DP2xEP2", "EP2xTP2"}) {
      cases.push_back({kind, l, Way::kTeTable});
      cases.push_back({kind, l, Way::kTeTable, true});
      if (l.find("EP") != std::string::npos) {
        cases.push_back({kind, l, Way::kTeTable, false, false, at::kBFloat16});
        cases.push_back({kind, l, Way::kTeTable, true, false, at::kBFloat16});
      }
    }
  }
  // Context parallelism, TE's table (a2a+p2p: a rule for its two axes): a sliding window where
  // the strategy takes one (not p2p or a2a+p2p, as TE), GQA's 2 key/value heads with a2a where
  // each rank keeps whole ones (CP2 alone; a2a+p2p's a2a axis is 2).
  for (const Layout& l : test::cp_matrix_layouts()) {
    for (Kind kind :
         {Kind::kMhaFused, Kind::kMhaCpRope, Kind::kMhaCpWindow, Kind::kMhaCpThd, Kind::kMhaGqa,
          Kind::kEncoder, Kind::kDecoder, Kind::kParallel, Kind::kSandwich}) {
      const bool gqa = kind == Kind::kMhaCpRope || kind == Kind::kMhaCpWindow ||
                       kind == Kind::kMhaCpThd || kind == Kind::kMhaGqa;
      const bool window = kind == Kind::kMhaCpWindow || kind == Kind::kSandwich;
      if (window && (l.cp_comm_type == "p2p" || l.cp_comm_type == "a2a+p2p")) continue;
      // (the load-balanced order: attention kinds, whose dropout draws at each token's own place)
      const bool attention_only = kind == Kind::kMhaFused || kind == Kind::kMhaCpRope ||
                                  kind == Kind::kMhaCpWindow || kind == Kind::kMhaGqa;
      if (l.cp_load_balanced && !attention_only) continue;
      // (a2a splits the 2 key/value heads: over 2 ranks, and not beside tensor parallelism)
      const bool cp2 = l.name.rfind("CP2", 0) == 0 || l.name.rfind("DP2xCP2", 0) == 0;
      if (gqa && l.cp_comm_type == "a2a" && !cp2) continue;
      cases.push_back({kind, l.name, Way::kTeTable});
      cases.push_back({kind, l.name, Way::kTeTable, true});
      if (l.name.rfind("CP2", 0) == 0 && (kind == Kind::kMhaFused || kind == Kind::kDecoder)) {
        cases.push_back({kind, l.name, Way::kTeTable, false, false, at::kBFloat16});
      }
    }
  }
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  static const char* kinds[] = {
      "DenseColumn",   "DenseRow",           "MlpGelu",          "MlpGated",
      "MhaFusedQkv",   "MhaGqaRope",         "MhaWindowAlibi",   "MhaArbitraryBiasSink",
      "EncoderPostLn", "DecoderRopeQkNorm",  "ParallelL2QkNorm", "SandwichSoftcap",
      "MhaCpGqaRope",  "MhaCpWindowSoftcap", "MhaCpThdRope",     "Moe",
      "MoeDecoder"};
  static const char* ways[] = {"TeTable", "ExtendedRules", "CustomNames"};
  return std::string(kinds[static_cast<int>(info.param.kind)]) + "_" + info.param.layout + "_" +
         ways[static_cast<int>(info.param.way)] + (info.param.dropout ? "_Dropout" : "") +
         (info.param.uneven ? "_Uneven" : "") +
         (info.param.dtype == at::kBFloat16 ? "_BF16"
          : info.param.dtype == at::kHalf   ? "_FP16"
                                            : "");
}

INSTANTIATE_TEST_SUITE_P(Matrix, Equivalence, ::testing::ValuesIn(all_cases()), case_name);

// A padding mask with a head dim is refused on a mesh as on one process, before a rank narrows
// it to its heads (where it would look like a one-head mask).
TEST(Attention, APerHeadPaddingMaskIsRefusedBeforeTheHeadsSplit) {
  set_warning_handler([](std::string_view) {});
  run_local_ranks(4, [](int) {
    DeviceMesh mesh({4}, {"tp"});
    MeshScope scope(mesh);
    MeshResourceScope resource(parse_mesh_resource("tp=tp"));
    MultiHeadAttention mha([&] {
      auto made = MultiHeadAttentionOptions(16, 4);
      made.attention().attn_mask_type("padding");
      return made;
    }());
    const Shape sh = shape_of(false);
    const DTensor x = DTensor::distribute(global_input(sh), mesh, {Replicate{}});
    EXPECT_ERROR(mha(x, std::nullopt, at::zeros({sh.batch, 4, sh.seq, sh.seq}, at::kBool)),
                 "the padding mask of attn_mask_type 'padding' has 4 heads");
  });
  set_warning_handler(nullptr);
}

// A core_attention_bias that requires grad gets, on every rank of DP2xTP2, the whole gradient
// one process computes: a full-size batch or head dim is split with the attention's and gathered
// back, a broadcast one is a partial sum over the ranks that split it, reduced.
TEST(AttentionParallel, ABiasGetsTheWholeGradientOnEveryRank) {
  const Shape sh = shape_of(false);
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{sh.batch, 4, sh.seq, sh.seq}, std::vector<int64_t>{1, 1, 1, sh.seq},
        std::vector<int64_t>{sh.batch, 1, sh.seq, sh.seq},
        std::vector<int64_t>{1, 4, sh.seq, sh.seq}}) {
    const at::Tensor bias0 = test::seeded_integers(shape, 36).to(at::kFloat) / 4.0;
    const auto args = [](const at::Tensor& bias) {
      return AttentionArgs().core_attention_bias_type("post_scale_bias").core_attention_bias(bias);
    };
    manual_seed(21);
    MultiHeadAttention one([&] {
      auto made = MultiHeadAttentionOptions(16, 4);
      made.attention().attn_mask_type("causal");
      return made;
    }());
    at::Tensor bias_ref = bias0.clone().requires_grad_(true);
    (one(global_input(sh), {}, {}, args(bias_ref)) * output_weight(sh, 16)).sum().backward();
    run_local_ranks(4, [&](int rank) {
      DeviceMesh mesh({2, 2}, {"data", "tp"});
      MeshScope scope(mesh);
      MeshResourceScope resource(parse_mesh_resource("dp=data,tp=tp"));
      manual_seed(21);
      MultiHeadAttention mha([&] {
        auto made = MultiHeadAttentionOptions(16, 4);
        made.attention().attn_mask_type("causal");
        return made;
      }());
      const std::vector<Placement> in = {Shard{0}, Replicate{}};
      const DTensor x = DTensor::distribute(global_input(sh), mesh, in);
      at::Tensor bias = bias0.clone().requires_grad_(true);
      const at::Tensor y = mha(x, std::nullopt, {}, args(bias)).full_tensor();
      (y * output_weight(sh, 16)).sum().backward();
      ASSERT_TRUE(bias.grad().defined());
      EXPECT_TRUE(Near(bias.grad(), bias_ref.grad(), 1e-5))
          << "bias " << bias0.sizes() << " on rank " << rank;
    });
  }
}

// GradientBuckets sums only what it deferred: a parameter's gradient from earlier
// micro-batches, and from a use the DTensor core does not reduce (a tied weight used locally as
// well), stay as they are. Was: finish() all-reduced the whole .grad(), counting those once per
// rank.
TEST(GradientBucketsParallel, SumOnlyTheDeferredContributions) {
  const Shape sh = shape_of(false);
  manual_seed(21);
  Dense one(DenseOptions(16, 12).use_bias(false));
  for (int step = 0; step < 2; ++step) {
    (one(global_input(sh)) * output_weight(sh, 12)).sum().backward();
  }
  const at::Tensor want = one->kernel.grad().clone();
  run_local_ranks(2, [&](int rank) {
    DeviceMesh mesh({2}, {"data"});
    MeshScope scope(mesh);
    MeshResourceScope resource(parse_mesh_resource("dp=data"));
    manual_seed(21);
    Dense dense(DenseOptions(16, 12).use_bias(false));
    const DTensor x = DTensor::distribute(global_input(sh), mesh, {Shard{0}});
    for (int step = 0; step < 2; ++step) {  // two micro-batches, one bucket each
      GradientBuckets buckets;
      (dense(x).full_tensor() * output_weight(sh, 12)).sum().backward();
      buckets.finish();
    }
    EXPECT_TRUE(Near(dense->kernel.grad(), want, 1e-5)) << "accumulated, rank " << rank;
    // A tied use: the same kernel read locally, its gradient (here 1 per element on each rank,
    // as each rank adds it) is not summed by the buckets.
    dense->kernel.mutable_grad() = at::Tensor();
    {
      GradientBuckets buckets;
      ((dense(x).full_tensor() * output_weight(sh, 12)).sum() + dense->kernel.sum()).backward();
      buckets.finish();
    }
    EXPECT_TRUE(Near(dense->kernel.grad(), want / 2 + 1, 1e-5)) << "tied, rank " << rank;
    // A backward after finish() (the buckets still in scope) is reduced at once, not lost.
    dense->kernel.mutable_grad() = at::Tensor();
    {
      GradientBuckets buckets;
      buckets.finish();
      (dense(x).full_tensor() * output_weight(sh, 12)).sum().backward();
      EXPECT_EQ(buckets.pending(), 0);
    }
    ASSERT_TRUE(dense->kernel.grad().defined());
    EXPECT_TRUE(Near(dense->kernel.grad(), want / 2, 1e-5)) << "after finish, rank " << rank;
  });
}

// GQA under tensor parallelism needs the key/value heads to split as evenly as the query heads:
// 2 groups over 4 ranks stop every rank with the same message, before any collective hangs.
TEST(Attention, GqaHeadsMustSplitEvenly) {
  set_warning_handler([](std::string_view) {});
  run_local_ranks(4, [](int) {
    DeviceMesh mesh({4}, {"tp"});
    MeshScope scope(mesh);
    MeshResourceScope resource(parse_mesh_resource("tp=tp"));
    MultiHeadAttention mha([&] {
      auto made = MultiHeadAttentionOptions(16, 4);
      made.attention().num_gqa_groups(2);
      return made;
    }());
    const DTensor x = DTensor::distribute(global_input(shape_of(false)), mesh, {Replicate{}});
    EXPECT_ERROR(mha(x),
                 "4 query heads and 2 key/value heads (num_gqa_groups) cannot be split "
                 "evenly over the 4 ranks of mesh axes 'tp'");
  });
  set_warning_handler(nullptr);
}

}  // namespace
}  // namespace te::nn

namespace te::nn {
namespace {

TEST(ShardedModules, AWholeModuleShardsOntoAMeshAndGathersBack) {
  set_warning_handler([](std::string_view) {});
  run_local_ranks(2, [](int rank) {
    DeviceMesh mesh({2}, {"tp"});
    manual_seed(3);
    TransformerLayer whole([&] {
      auto made = TransformerLayerOptions(16, 24, 4).hidden_dropout(0).intermediate_dropout(0);
      made.self_attention().attention().attention_dropout(0);
      return made;
    }());  // built on one process: whole weights
    std::map<std::string, at::Tensor> original;
    for (const auto& p : whole->named_parameters()) original[p.key()] = p.value().detach().clone();

    MeshScope scope(mesh);
    MeshResourceScope resource(parse_mesh_resource("tp=tp"));
    manual_seed(3);
    TransformerLayer direct([&] {
      auto made = TransformerLayerOptions(16, 24, 4).hidden_dropout(0).intermediate_dropout(0);
      made.self_attention().attention().attention_dropout(0);
      return made;
    }());
    EXPECT_FALSE(whole->is_sharded());
    shard_module(*whole, mesh);
    EXPECT_TRUE(whole->mlp->is_sharded());
    auto direct_params = direct->named_parameters();
    for (const auto& p : whole->named_parameters()) {
      EXPECT_TRUE(at::equal(p.value(), direct_params[p.key()])) << p.key() << " on rank " << rank;
    }
    const at::Tensor x = test::seeded_integers({2, 6, 16}, 5).to(at::kFloat) / 7;
    DTensor dx = DTensor::distribute(x, mesh, {Replicate{}});
    EXPECT_TRUE(at::equal(whole(dx).full_tensor(), direct(dx).full_tensor()));

    gather_module(*whole);
    for (const auto& p : whole->named_parameters()) {
      EXPECT_TRUE(at::equal(p.value(), original[p.key()])) << p.key();
    }
    EXPECT_FALSE(whole->mlp->is_sharded());
  });
  set_warning_handler(nullptr);
}

TEST(ShardedModules, ValidateShardingReportsEverythingAtOnce) {
  run_local_ranks(2, [](int) {
    DeviceMesh mesh({2}, {"tp"});
    MeshScope scope(mesh);
    AxisRulesScope rules(parse_axis_rules("w_tp=tp,w_fsdp="));
    LayerNormMLP mlp(LayerNormMLPOptions(8, 7));  // 7 does not split over 2 ranks
    const ShardingReport report = check_sharding(*mlp);
    EXPECT_EQ(report.uneven,
              (std::vector<std::string>{
                  "wi_kernel dim 2 ('w_tp') of size 7 over mesh axes 'tp' (2 ranks)",
                  "wo_kernel dim 0 ('w_tp') of size 7 over mesh axes 'tp' (2 ranks)"}));
    EXPECT_EQ(report.unmatched,
              (std::vector<std::string>{"layernorm.ln_bias dim 0: logical axis 'w_no_shard'",
                                        "layernorm.scale dim 0: logical axis 'w_no_shard'",
                                        "wi_kernel dim 1: logical axis 'w_joined'"}));
    try {
      validate_sharding(*mlp);
      FAIL();
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("uneven: wi_kernel dim 2"), std::string::npos) << msg;
      EXPECT_NE(msg.find("no rule: wi_kernel dim 1: logical axis 'w_joined'"), std::string::npos)
          << msg;
    }
    AxisRulesScope complete(parse_axis_rules("w_tp=tp,w_fsdp=,w_joined=,w_no_shard="));
    LayerNormMLP even(LayerNormMLPOptions(8, 16));
    EXPECT_TRUE(check_sharding(*even).ok()) << check_sharding(*even).to_string();
    EXPECT_NO_THROW(validate_sharding(*even));
  });
}

}  // namespace
}  // namespace te::nn

namespace te::nn {
namespace {

// CPU autocast (bf16) over fp32 weights, as te-encoder --dtype bf16 runs: FSDP's gathered GEMM
// (GatheredDense) multiplies in bf16 forward and must do the same in backward, where autocast is
// off. A GEMM above oneDNN's minimum (16^3 multiply-adds) with an fp32 kernel and a bf16
// gradient used to throw "expected scalar type BFloat16 but found Float" on AVX-512 CPUs (and was
// widened to fp32 silently elsewhere). The gradients equal data parallel's (whole kernel), where
// autocast's own matmul backward runs, within bf16 rounding.
TEST(ShardedModules, FsdpUnderCpuAutocastBackpropagatesInTheAutocastDtype) {
  set_warning_handler([](std::string_view) {});
  const std::vector<int64_t> shape = {4, 16, 64};
  std::map<std::string, std::vector<at::Tensor>> grads;  // layout -> [x grad, kernel grad]
  std::mutex mu;
  for (const char* spec : {"dp=data", "fsdp=data"}) {
    run_local_ranks(2, [&](int rank) {
      DeviceMesh mesh({2}, {"data"});
      MeshScope mesh_scope(mesh);
      MeshResourceScope resource(parse_mesh_resource(spec));
      manual_seed(5);
      Dense dense(DenseOptions(64, 128).use_bias(false).kernel_axes({"w_fsdp", "w_tp"}));
      const auto placements =
          placements_for(*resolve_logical_axes({"batch", "seqlen", "hidden"}), mesh);
      at::Tensor x_local =
          piece_of(test::seeded_integers(shape, 3).to(at::kFloat) / 9.0, mesh, placements, rank)
              .requires_grad_(true);
      const DTensor x = DTensor::from_local(x_local, mesh, placements, shape);
      DTensor y = [&] {
        const te::test::CpuAutocast bf16(true);
        return dense(x);
      }();
      EXPECT_EQ(y.to_local().scalar_type(), at::kBFloat16);
      y.full_tensor().to(at::kFloat).sum().backward();
      const auto layouts = named_parameter_layouts(*dense);
      const ParameterLayout& pl = layouts.at("kernel");
      EXPECT_EQ(pl.mesh && is_shard(pl.placements[0]), std::string(spec) == "fsdp=data");
      const at::Tensor kernel_grad =
          pl.mesh ? DTensor::from_local(dense->kernel.grad(), mesh, pl.placements, pl.global_shape)
                        .full_tensor()
                  : dense->kernel.grad();
      EXPECT_EQ(kernel_grad.scalar_type(), at::kFloat);
      if (rank == 0) {
        std::lock_guard<std::mutex> lock(mu);
        grads[spec] = {x_local.grad().clone(), kernel_grad.clone()};
      }
    });
  }
  set_warning_handler(nullptr);
  ASSERT_EQ(grads.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(Near(grads["fsdp=data"][i], grads["dp=data"][i], 1.0 / 128)) << i;
  }
}

}  // namespace
}  // namespace te::nn
