// Rotary position embeddings: TE's RotaryPositionEmbedding and apply_rotary_pos_emb
// (transformer_engine/pytorch/attention/rope.py at d0067d0da), on tensors and DTensors.
#include "te/nn/rope.h"

#include <ATen/ATen.h>

#include <cmath>
#include <string>
#include <vector>

#include "te/error.h"
#include "te/nn/context_parallel.h"
#include "te/nn/functional.h"

namespace te::nn {

// ---- RotaryPositionEmbedding -------------------------------------------------------------------

RotaryPositionEmbeddingImpl::RotaryPositionEmbeddingImpl(
    const RotaryPositionEmbeddingOptions& options_)
    : options(options_) {
  reset();
}

void RotaryPositionEmbeddingImpl::reset() {
  TE_CHECK(options.rotary_percent() > 0 && options.rotary_percent() <= 1,
           "RotaryPositionEmbedding: rotary_percent ", options.rotary_percent(),
           " is not in (0, 1]");
  // TE: dim = int(dim * rotary_percent) when rotary_percent < 1.
  const int64_t dim =
      options.rotary_percent() < 1.0
          ? static_cast<int64_t>(static_cast<double>(options.dim()) * options.rotary_percent())
          : options.dim();
  TE_CHECK(dim > 0 && dim % 2 == 0, "RotaryPositionEmbedding: the rotary dim ", dim,
           (options.rotary_percent() < 1.0 ? " (dim * rotary_percent)" : ""),
           " is not a positive even number; rotation turns pairs of dims");
  TE_CHECK(options.rotary_base() > 0, "RotaryPositionEmbedding: rotary_base ",
           options.rotary_base(), " is not positive");
  if (const auto& f = options.seq_len_interpolation_factor()) {
    TE_CHECK(*f > 0, "RotaryPositionEmbedding: seq_len_interpolation_factor ", *f,
             " is not positive");
    // TE scales the positions only when both are given (rope.py forward); the factor alone
    // would be ignored there, so it is refused here rather than silently dropped.
    TE_CHECK(options.pretrained_max_position_embeddings().has_value(),
             "RotaryPositionEmbedding: seq_len_interpolation_factor ", *f,
             " needs pretrained_max_position_embeddings (the length the model was trained on), "
             "as in Transformer Engine, where the factor alone does nothing");
  }
  if (const auto& m = options.pretrained_max_position_embeddings()) {
    TE_CHECK(*m > 0, "RotaryPositionEmbedding: pretrained_max_position_embeddings ", *m,
             " is not positive");
  }
  const double a = options.attention_factor();
  TE_CHECK(std::isfinite(a) && a > 0, "RotaryPositionEmbedding: attention_factor ", a,
           " is not positive and finite");
  // 1 / base^(arange(0, dim, 2) / dim), in float32 as TE computes it.
  const at::Tensor exponent = at::arange(0, dim, 2, at::kFloat) / static_cast<double>(dim);
  const at::Tensor inv = at::pow(options.rotary_base(), exponent).reciprocal();
  // Each inverse frequency divided by its factor (none: as it is).
  auto divided = [&](const std::vector<double>& f, const char* what) {
    if (f.empty()) return inv;
    TE_CHECK(static_cast<int64_t>(f.size()) == dim / 2, "RotaryPositionEmbedding: ", f.size(), " ",
             what, " for ", dim / 2, " frequencies (the rotary dim ", dim, " / 2)");
    for (std::size_t i = 0; i < f.size(); ++i) {
      TE_CHECK(std::isfinite(f[i]) && f[i] > 0, "RotaryPositionEmbedding: ", what, "[", i, "] is ",
               f[i], ": each must be positive and finite");
    }
    return inv / at::tensor(f, at::kDouble).to(at::kFloat);
  };
  inv_freq = register_buffer("inv_freq", divided(options.frequency_factors(), "frequency_factors"));
  if (!options.long_frequency_factors().empty()) {
    TE_CHECK(options.pretrained_max_position_embeddings().has_value(),
             "RotaryPositionEmbedding: long_frequency_factors need "
             "pretrained_max_position_embeddings, the length beyond which they replace "
             "frequency_factors");
    long_inv_freq = register_buffer(
        "long_inv_freq", divided(options.long_frequency_factors(), "long_frequency_factors"));
  }
}

void RotaryPositionEmbeddingImpl::pretty_print(std::ostream& stream) const {
  stream << "te::nn::RotaryPositionEmbedding(dim=" << inv_freq.size(0) * 2
         << ", base=" << options.rotary_base() << (options.interleaved() ? ", interleaved" : "");
  if (long_inv_freq.defined()) stream << ", long factors";
  if (options.attention_factor() != 1.0) {
    stream << ", attention_factor=" << options.attention_factor();
  }
  stream << ")";
}

at::Tensor RotaryPositionEmbeddingImpl::forward(int64_t max_seq_len, int64_t offset) {
  TE_CHECK(max_seq_len > 0 && offset >= 0, "RotaryPositionEmbedding: max_seq_len (", max_seq_len,
           ") must be positive and offset (", offset, ") not negative");
  at::Tensor seq = at::arange(max_seq_len, inv_freq.options()) + static_cast<double>(offset);
  // LongRoPE: the long factors for a sequence longer than the pretrained length.
  const bool long_set = long_inv_freq.defined() &&
                        offset + max_seq_len > *options.pretrained_max_position_embeddings();
  if (options.pretrained_max_position_embeddings() && options.seq_len_interpolation_factor()) {
    const double pretrained = static_cast<double>(*options.pretrained_max_position_embeddings());
    const double factor = *options.seq_len_interpolation_factor();
    if (static_cast<double>(max_seq_len) > pretrained * factor) {
      seq = seq * (1.0 / (static_cast<double>(max_seq_len) / pretrained));  // dynamic
    } else {
      seq = seq * (1.0 / factor);  // fixed linear scaling
    }
  }
  const at::Tensor freqs = at::outer(seq, long_set ? long_inv_freq : inv_freq);  // [s, dim / 2]
  const at::Tensor emb = options.interleaved()
                             ? at::stack({freqs, freqs}, -1).flatten(-2)  // f0 f0 f1 f1 ...
                             : at::cat({freqs, freqs}, -1);               // f0 f1 ... f0 f1 ...
  return emb.reshape({emb.size(0), 1, 1, emb.size(1)});
}

// ---- apply_rotary_pos_emb ----------------------------------------------------------------------

namespace functional {

namespace {

// Where a format keeps the sequence and batch dims (thd: tokens, no batch dim).
struct RopeLayout {
  int64_t seq_dim = 0;
  int64_t batch_dim = -1;
  int64_t dims = 4;
  bool packed = false;
};

RopeLayout rope_layout(const std::string& format) {
  if (format == "bshd") return {1, 0, 4, false};
  if (format == "sbhd") return {0, 1, 4, false};
  if (format == "thd") return {0, -1, 3, true};
  TE_FAIL("apply_rotary_pos_emb: tensor_format '", format, "' is not 'sbhd', 'bshd' or 'thd'");
}

// The checked arguments, on the CPU as int64 where they are indices.
struct RopeArgs {
  RopeLayout layout;
  at::Tensor freqs;  // [s2, d2], float32
  int64_t d2 = 0;
  at::Tensor cu_seqlens;       // [sequences + 1] (thd)
  at::Tensor start_positions;  // [batch or sequences], or undefined
  double scale = 1.0;          // the attention factor on cos and sin
};

at::Tensor index_vector(const at::Tensor& t, const char* what) {
  TE_CHECK(t.dim() == 1 && !at::isFloatingType(t.scalar_type()) && t.scalar_type() != at::kBool,
           "apply_rotary_pos_emb: ", what, " must be a 1-D integer tensor, got ", t.sizes(), " ",
           t.scalar_type());
  return t.to(at::kCPU, at::kLong).contiguous();
}

RopeArgs check_rope(at::IntArrayRef sizes, const at::Tensor& freqs, const std::string& format,
                    const at::Tensor& cu_seqlens, const at::Tensor& start_positions,
                    double attention_factor, int64_t cp_size = 1) {
  RopeArgs a;
  a.layout = rope_layout(format);
  TE_CHECK(std::isfinite(attention_factor) && attention_factor > 0,
           "apply_rotary_pos_emb: attention_factor ", attention_factor,
           " is not positive and finite");
  a.scale = attention_factor;
  const std::vector<int64_t> shape(sizes.begin(), sizes.end());
  TE_CHECK(static_cast<int64_t>(shape.size()) == a.layout.dims, "apply_rotary_pos_emb: t ", sizes,
           " is not ", format == "thd" ? "[tokens, heads, head_dim]" : "4-dim ", format);
  TE_CHECK(freqs.defined() && freqs.dim() == 4 && freqs.size(1) == 1 && freqs.size(2) == 1,
           "apply_rotary_pos_emb: freqs ", freqs.defined() ? freqs.sizes() : at::IntArrayRef{},
           " is not [s, 1, 1, rotary_dim] (RotaryPositionEmbedding's output)");
  a.d2 = freqs.size(3);
  const int64_t d = shape.back();
  TE_CHECK(a.d2 > 0 && a.d2 % 2 == 0 && a.d2 <= d, "apply_rotary_pos_emb: the rotary dim ", a.d2,
           " of freqs ", freqs.sizes(), " must be even and at most the head dim ", d);
  a.freqs = freqs.reshape({freqs.size(0), a.d2}).to(at::kFloat);
  int64_t longest = 0, sequences = 0;
  if (a.layout.packed) {
    TE_CHECK(cu_seqlens.defined(), "apply_rotary_pos_emb: tensor_format 'thd' needs cu_seqlens");
    a.cu_seqlens =
        checked_cu_seqlens(cu_seqlens, "apply_rotary_pos_emb", "cu_seqlens", shape[0] * cp_size);
    const auto n = a.cu_seqlens.size(0);
    const int64_t* cu = a.cu_seqlens.data_ptr<int64_t>();
    for (int64_t i = 1; i < n; ++i) longest = std::max(longest, cu[i] - cu[i - 1]);
    sequences = n - 1;
  } else {
    TE_CHECK(!cu_seqlens.defined(),
             "apply_rotary_pos_emb: cu_seqlens is for tensor_format "
             "'thd'; ",
             format, " has whole sequences");
    longest = shape[static_cast<std::size_t>(a.layout.seq_dim)] * cp_size;
    sequences = shape[static_cast<std::size_t>(a.layout.batch_dim)];
  }
  // The last position used: the longest sequence's, or with start positions each sequence's
  // start plus its length.
  int64_t needed = longest;
  if (start_positions.defined()) {
    a.start_positions = index_vector(start_positions, "start_positions");
    TE_CHECK(a.start_positions.size(0) == sequences, "apply_rotary_pos_emb: start_positions has ",
             a.start_positions.size(0), " entries for ", sequences, " sequences");
    if (sequences > 0) {
      TE_CHECK(a.start_positions.min().item<int64_t>() >= 0,
               "apply_rotary_pos_emb: start_positions has a negative entry");
      const int64_t* start = a.start_positions.data_ptr<int64_t>();
      const int64_t* cu = a.layout.packed ? a.cu_seqlens.data_ptr<int64_t>() : nullptr;
      for (int64_t i = 0; i < sequences; ++i) {
        needed = std::max(needed, start[i] + (cu ? cu[i + 1] - cu[i] : longest));
      }
    }
  }
  TE_CHECK(needed <= a.freqs.size(0), "apply_rotary_pos_emb: positions up to ", needed - 1,
           " need freqs for ", needed, " positions, but freqs has ", a.freqs.size(0),
           "; make RotaryPositionEmbedding's max_seq_len larger");
  return a;
}

// Rotates the first d2 dims of each head of `t` by `angles` (float32, broadcasting to
// t[..., :d2]), in halves or interleaved pairs, cos and sin times `scale`; the arithmetic in
// float32 as TE's fused kernel.
at::Tensor rotate(const at::Tensor& t, const at::Tensor& angles, int64_t d2, bool interleaved,
                  double scale) {
  const at::Tensor x = t.narrow(-1, 0, d2).to(at::kFloat);
  at::Tensor turned;
  if (interleaved) {  // (x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)
    turned = at::stack({-x.slice(-1, 1, d2, 2), x.slice(-1, 0, d2, 2)}, -1).flatten(-2);
  } else {  // (x_a, x_b) -> (-x_b, x_a)
    turned = at::cat({-x.narrow(-1, d2 / 2, d2 / 2), x.narrow(-1, 0, d2 / 2)}, -1);
  }
  at::Tensor cos = angles.cos(), sin = angles.sin();
  if (scale != 1.0) {  // transformers: emb.cos() * attention_scaling, in float32
    cos = cos * scale;
    sin = sin * scale;
  }
  at::Tensor out = (x * cos + turned * sin).to(t.scalar_type());
  const int64_t d = t.size(-1);
  return d2 < d ? at::cat({out, t.narrow(-1, d2, d - d2)}, -1) : out;
}

// The piece of a tensor of global `sizes` whose sequence dim starts at `seq_offset` and batch
// dim at `batch_offset`, rotated by its global positions.
at::Tensor rotate_piece(const at::Tensor& t, const RopeArgs& a, bool interleaved,
                        int64_t seq_offset, int64_t batch_offset) {
  const at::Tensor freqs = a.freqs.to(t.device());
  const int64_t d2 = a.d2;
  if (a.layout.packed) {
    // Token j of sequence i sits at position j - cu_seqlens[i] (+ start_positions[i]).
    const at::Tensor cu = a.cu_seqlens;
    const at::Tensor seq_id = at::repeat_interleave(cu.diff());
    at::Tensor pos = at::arange(t.size(0), cu.options()) - cu.index_select(0, seq_id);
    if (a.start_positions.defined()) pos = pos + a.start_positions.index_select(0, seq_id);
    return rotate(t, freqs.index_select(0, pos.to(t.device())).view({t.size(0), 1, d2}), d2,
                  interleaved, a.scale);
  }
  const int64_t s = t.size(a.layout.seq_dim), b = t.size(a.layout.batch_dim);
  const bool bshd = a.layout.seq_dim == 1;
  if (!a.start_positions.defined()) {
    const at::Tensor angles = freqs.narrow(0, seq_offset, s);
    return rotate(t, bshd ? angles.view({1, s, 1, d2}) : angles.view({s, 1, 1, d2}), d2,
                  interleaved, a.scale);
  }
  // Per sequence: positions start_positions[i] + seq_offset + j.
  const at::Tensor start = a.start_positions.narrow(0, batch_offset, b);
  const at::Tensor steps = at::arange(seq_offset, seq_offset + s, start.options());
  const at::Tensor pos = bshd ? start.view({b, 1}) + steps.view({1, s})   // [b, s]
                              : steps.view({s, 1}) + start.view({1, b});  // [s, b]
  const at::Tensor angles = freqs.index_select(0, pos.flatten().to(t.device()));
  return rotate(t, bshd ? angles.view({b, s, 1, d2}) : angles.view({s, b, 1, d2}), d2, interleaved,
                a.scale);
}

// A context parallel rank's tokens rotated by their global positions (TE's cp_size / cp_rank):
// thd, each sequence's chunks r and 2·cp-1-r in its slot; bshd / sbhd, the load-balanced layout.
at::Tensor rotate_cp_piece(const at::Tensor& t, const RopeArgs& a, bool interleaved, int64_t cp,
                           int64_t rank) {
  at::Tensor pos;
  if (a.layout.packed) {
    const at::Tensor idx = functional::cp_packed_indices(a.cu_seqlens, cp, rank);
    const at::Tensor seq = at::searchsorted(a.cu_seqlens, idx, false, /*right=*/true) - 1;
    pos = idx - a.cu_seqlens.index_select(0, seq);
  } else {
    std::vector<at::Tensor> runs;
    const int64_t s = t.size(a.layout.seq_dim);
    for (const functional::CpChunk& c : functional::cp_chunks(s * cp, cp, rank)) {
      runs.push_back(at::arange(c.start, c.start + c.length, at::kLong));
    }
    pos = at::cat(runs);
  }
  const at::Tensor angles = a.freqs.to(t.device()).index_select(0, pos.to(t.device()));
  const int64_t n = pos.size(0), d2 = a.d2;
  return rotate(t,
                a.layout.packed         ? angles.view({n, 1, d2})
                : a.layout.seq_dim == 1 ? angles.view({1, n, 1, d2})
                                        : angles.view({n, 1, 1, d2}),
                d2, interleaved, a.scale);
}

}  // namespace

at::Tensor apply_rotary_pos_emb(const at::Tensor& t, const at::Tensor& freqs,
                                const std::string& tensor_format, bool interleaved,
                                const at::Tensor& cu_seqlens, const at::Tensor& start_positions,
                                double attention_factor, int64_t cp_size, int64_t cp_rank) {
  TE_CHECK(t.defined(), "apply_rotary_pos_emb: t is undefined");
  TE_CHECK(cp_size >= 1 && cp_rank >= 0 && cp_rank < cp_size, "apply_rotary_pos_emb: cp_rank ",
           cp_rank, " is not one of cp_size ", cp_size, " ranks");
  TE_CHECK(cp_size == 1 || !start_positions.defined(),
           "apply_rotary_pos_emb: start_positions with cp_size ", cp_size,
           " is not supported, as TE's (rope.py L524-527 at d0067d0da)");
  const RopeArgs a = check_rope(t.sizes(), freqs, tensor_format, cu_seqlens, start_positions,
                                attention_factor, cp_size);
  if (cp_size > 1) return rotate_cp_piece(t, a, interleaved, cp_size, cp_rank);
  return rotate_piece(t, a, interleaved, 0, 0);
}

DTensor apply_rotary_pos_emb(const DTensor& t_in, const at::Tensor& freqs,
                             const std::string& tensor_format, bool interleaved,
                             const at::Tensor& cu_seqlens, const at::Tensor& start_positions,
                             double attention_factor) {
  const RopeArgs a =
      check_rope(t_in.sizes(), freqs, tensor_format, cu_seqlens, start_positions, attention_factor);
  const int64_t last = t_in.dim() - 1;
  // Whole head dims (the rotation pairs dims within a head); a partial sum is reduced first.
  for (std::size_t m = 0; m < t_in.placements().size(); ++m) {
    TE_CHECK(!(a.layout.packed && is_shard(t_in.placements()[m], 0)),
             "apply_rotary_pos_emb: a thd t ", t_in.to_string(),
             " is sharded on its token dim over mesh axis '", t_in.mesh().axis_names()[m],
             "', which would split sequences at unknown places; shard the heads instead");
  }
  const DTensor t = replicated_where(
      t_in, [last](const Placement& p, std::size_t) { return is_partial(p) || is_shard(p, last); });
  const auto piece = local_chunks(t.sizes(), t.mesh(), t.placements(), t.mesh().rank());
  const int64_t seq_offset = piece[static_cast<std::size_t>(a.layout.seq_dim)].offset;
  const int64_t batch_offset =
      a.layout.packed ? 0 : piece[static_cast<std::size_t>(a.layout.batch_dim)].offset;
  return DTensor::from_local(rotate_piece(t.to_local(), a, interleaved, seq_offset, batch_offset),
                             t.mesh(), t.placements(), t.sizes());
}

}  // namespace functional

}  // namespace te::nn
