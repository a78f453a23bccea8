#pragma once

// FP8: formats, tensors, scaling recipes and the autocast region (docs/ARCHITECTURE.md §5).
//
//   te::Fp8Autocast fp8(true, te::fp8::DelayedScaling{}, te::parse_mesh_resource("dp=data"));
//   auto y = layer(x);   // Dense, LayerNormDense, LayerNormMLP, attention: GEMMs in FP8
//   y.sum().backward();  // gradients in E5M2 (HYBRID); backward amaxes reduced at its end
//
// FP8 data is uint8 storage with a scale_inv, so it runs on every LibTorch; with LibTorch's
// Float8 dtypes (2.1 on) it converts both ways. The CPU code is the reference the CUDA kernels
// are held to.

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "te/compat.h"
#include "te/distributed/mesh.h"
#include "te/error.h"
#include "te/fp8/recipe.h"
#include "te/kernels/fp8_cast.h"
#include "te/sharding/context.h"

namespace te::fp8 {

/// The scale for `amax`: (fp8_max / amax) / 2^margin, or `old_scale` when amax <= 0, amax is not
/// finite, or the quotient is not finite (amax below fp8_max / FLT_MAX).
float compute_scale(float amax, float old_scale, float fp8_max, int margin);

/// One DelayedScaling update of n tensors' state, in place: amax_history [L, n] (row 0 holds
/// this step's amaxes), scale [n], scale_inv [n] (1 / scale), all fp32 on one device.
void update_scales(const at::Tensor& amax_history, const at::Tensor& scale,
                   const at::Tensor& scale_inv, const DelayedScaling& recipe, DType dtype);

// ---- tensors ----------------------------------------------------------------------------------

/// How a quantized tensor's scale_inv maps onto its codes [rows, cols] (a 2-D tensor's; per
/// tensor mode takes any shape): one fp32 scale for the whole tensor (scale_inv [1]), one per
/// 1x128 block along each row (fp32 [rows, ceil(cols / 128)]), one per 128x128 tile (fp32
/// [ceil(rows / 128), ceil(cols / 128)]), or MXFP8's one E8M0 power of two per 1x32 block (uint8
/// [rows, ceil(cols / 32)], unpadded and unswizzled: the layout cuBLASLt takes pads and swizzles
/// it). NVFP4's modes (1x16 blocks, 16x16 weight tiles) hold E2M1 codes two to a byte and E4M3
/// block scales (Fp8Tensor). Blocks at a ragged edge are shorter.
enum class ScalingMode { kTensor, kBlock1x128, kBlock128x128, kBlock1x32, kBlock1x16, kBlock16x16 };

/// Whether `mode` is one of NVFP4's (1x16, 16x16).
constexpr bool is_nvfp4(ScalingMode mode) {
  return mode == ScalingMode::kBlock1x16 || mode == ScalingMode::kBlock16x16;
}

/// "tensor", "1x128", "128x128", "1x32", "1x16", "16x16".
const char* to_string(ScalingMode mode);

/// FP8 data: codes (uint8, the shape of the value), scale_inv (shaped and typed per `scaling`)
/// and the element type: the value of code c is cast_from_fp8(c) * (the scale_inv of its block).
/// A GEMM operand's blocks run along its last dim, the one the GEMM contracts.
///
/// NVFP4 (scaling 1x16 or 16x16, TE's NVFP4BlockScaling): `data` holds E2M1 codes two to a byte
/// (uint8 [rows, cols / 2], element 2k in the low nibble: te/kernels/fp4_cast.h), `scale_inv` E4M3
/// codes (uint8 [rows, ceil(cols / 16)], or [ceil(rows / 16), ceil(cols / 16)] for 16x16 tiles),
/// `dtype` their type (kE4M3), and `amax` (fp32 [1]) the tensor's amax, the second level of
/// scaling: a code's value is e2m1(c) * (cast_from_fp8(block scale) * amax / (6 * 448)).
struct Fp8Tensor {
  at::Tensor data;
  at::Tensor scale_inv;
  DType dtype = DType::kE4M3;
  ScalingMode scaling = ScalingMode::kTensor;
  at::Tensor amax;  ///< NVFP4's tensor amax; undefined in the other modes

  /// The fp32 values.
  at::Tensor dequantize() const;
};

/// scale_from_amax (te/kernels/fp8_cast.h) elementwise over a tensor of fp32 amaxes, on its device:
/// the one rule current scaling and block scaling take their scales by.
at::Tensor scales_from_amax(const at::Tensor& amax, float fp8_max, bool power_2, float epsilon);

/// A 2-D x cast in blocks (ScalingMode kBlock1x128 or kBlock128x128): each block's scale is
/// scales_from_amax of its own amax, its codes RNE-saturating casts of x * scale, and
/// scale_inv = 1 / scale, as TE's quantize_transpose_{vector,square}_blockwise kernels do.
/// CPU tensors (the reference).
Fp8Tensor quantize_blocks(const at::Tensor& x, ScalingMode scaling, DType dtype, bool power_2,
                          float epsilon);
/// A 2-D x cast to MXFP8 (ScalingMode kBlock1x32, TE's MXFP8BlockScaling): per 1x32 block along
/// each row, amax = max |x| (NaN skipped), the scale e = e8m0_round_up(amax / fp8_max) (amax times
/// the fp32 reciprocal of the format's max, as TE), codes RNE-saturating casts of
/// x * e8m0_reciprocal(e), scale_inv = e. CPU tensors (the reference).
Fp8Tensor quantize_mx(const at::Tensor& x, DType dtype);
/// How quantize_nvfp4 casts.
struct Nvfp4Cast {
  /// kBlock1x16 (activations, gradients) or kBlock16x16 (TE's 2-D weight tiles).
  ScalingMode scaling = ScalingMode::kBlock1x16;
  /// The amax the tensor scale comes from: the whole tensor's where x is a rank's piece of it
  /// (what keeps a sharded cast equal to one process's); unset: x's own (NaN skipped).
  std::optional<float> amax;
  /// Stochastic rounding (TE's NVFP4 gradients): each code rounds up or down to its E2M1
  /// neighbours with the probability that makes it unbiased, from the Philox word of element
  /// r * cols + c in (seed, call) (te/kernels/philox.h dropout_word).
  bool stochastic = false;
  uint64_t seed = 0, call = 0;
};
/// A 2-D x cast to NVFP4 (TE's NVFP4BlockScaling quantizer, cast/nvfp4/core_nvfp4.cuh and
/// quantize_transpose_nvfp4.cuh): S_enc = 2688 / amax in fp32 (FLT_MAX where that overflows; 1
/// for an amax of 0 or infinity); per block (16 along each row, or a 16x16 tile) its amax b (NaN
/// skipped) gives the E4M3 scale s = e4m3(min(b * (S_enc * (1/6)), FLT_MAX)) (RNE, saturating),
/// and its elements the E2M1 codes of x * min(1 / (s * (1 / S_enc)), FLT_MAX). cols must be even
/// (two codes a byte; TE takes multiples of 16). CPU tensors (the reference).
Fp8Tensor quantize_nvfp4(const at::Tensor& x, const Nvfp4Cast& how = {});
/// TE's random Hadamard transform of a 2-D x along its rows in blocks of 16 (the NVFP4 wgrad
/// operands'): each block b of 16 becomes b D H / 4, H the 16x16 Sylvester Hadamard matrix and D
/// TE's fixed signs (reference_nvfp4.py get_wgrad_sign_vector), an orthogonal map, so two operands
/// both transformed along the dim a GEMM contracts multiply to the same product. cols not a
/// multiple of 16 are padded with zeros to one first (fp32 [rows, 16 * ceil(cols / 16)]).
at::Tensor hadamard16(const at::Tensor& x);
/// The same tile codes of x^T (128x128, or NVFP4's 16x16 with an even row count): the codes and
/// the tile scales transposed (a square tile's transpose is a tile of x^T with the same amax, and
/// an NVFP4 tensor keeps its amax), so a weight cast once serves both GEMMs.
Fp8Tensor transpose_tiles(const Fp8Tensor& t);

/// Casts x * scale (RNE, saturating) to `dtype`; `scale` is an fp32 one-element tensor. When
/// `amax` (fp32, one element) is given, max |x| is folded into it (amax = max(amax, |x|)).
/// CPU and CUDA tensors.
Fp8Tensor quantize(const at::Tensor& x, const at::Tensor& scale, DType dtype,
                   const at::Tensor& amax = {});
/// x cast to `dtype` with the scale its own amax gives (fp8_max / amax; 1 when amax <= 0 or not
/// finite): static data such as weights, quantized once.
Fp8Tensor quantize_to_own_scale(const at::Tensor& x, DType dtype);
/// Row-wise scaling, for lookup tables held in FP8 (te::nn::Embedding's FP8 weights): each row of
/// a 2-D x cast to `dtype` with the scale its own amax gives (as quantize_to_own_scale does for a
/// whole tensor). Returns the codes [rows, cols] and scale_inv [rows] (fp32), so row r's values are
/// cast_from_fp8(codes[r]) * scale_inv[r]. CPU and CUDA tensors.
std::pair<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x, DType dtype);
/// The fp32 values of codes [..., cols] whose rows carry scale_inv [...] (quantize_rows' layout,
/// after any lookup of rows).
at::Tensor dequantize_rows(const at::Tensor& codes, const at::Tensor& scale_inv, DType dtype);
/// A 2-D x cast once into both layouts: codes of x and of x^T (contiguous), one scale_inv.
std::pair<Fp8Tensor, Fp8Tensor> cast_transpose(const at::Tensor& x, const at::Tensor& scale,
                                               DType dtype, const at::Tensor& amax = {});
/// max |x| as an fp32 one-element tensor (NaN when x holds a NaN).
at::Tensor amax(const at::Tensor& x);

/// An amax (fp32) to reduce by MAX over the dims `dims` of `mesh`; without a mesh or dims it stays
/// as it is.
struct AmaxReduction {
  at::Tensor amax;
  std::optional<DeviceMesh> mesh;
  std::vector<int64_t> dims;
};
/// Replaces each item's amax by its reduction: the items that share a mesh and dims go in one
/// all-reduce (MAX) of their amaxes concatenated, the groups in the order of their first item, so
/// ranks that give the same list make the same collectives. DelayedScaling's amax histories and
/// held FP8 weights (te/nn/fp8_weights.h) are reduced through it.
void reduce_amaxes(std::vector<AmaxReduction>& items);

/// D = (a @ b) * a.scale_inv * b.scale_inv in fp32, for a [M, K] and b [K, N]: FP8 products are
/// exact in fp32 (4 x 4 significant bits). CPU: the reference (exact decode, fp32 GEMM, output
/// scaling); CUDA: cuBLASLt FP8 with scale pointers (sm_89+), whose tensor cores accumulate in
/// ~13 mantissa bits, all of K with `fast_accumulation` (TE's forward GEMM), else promoting
/// partial sums to fp32 (TE's gradient GEMMs). D comes in `out` (the fp32 result rounded once);
/// on CUDA a bf16 or fp16 D is written by the GEMM itself, as TE's is.
at::Tensor gemm(const Fp8Tensor& a, const Fp8Tensor& b, bool fast_accumulation = false,
                at::ScalarType out = at::kFloat);
/// The same GEMM with b given transposed, b_t [N, K]: the layout FP8 tensor cores take, so a
/// caller that holds it (cast_transpose's second tensor) spares the transpose.
/// Block-scaled operands (both blocked along K: a 1x128 or 128x128, b_t the other or 1x128; or
/// both 1x32; NVFP4 with NVFP4) multiply here only: each dequantized to fp32 (exact for
/// power-of-two scales, one fp32 rounding per element otherwise) and an fp32 GEMM, on the CPU or
/// on the device (cuBLASLt's block-scaled GEMMs are not used yet: docs/gpu.md).
at::Tensor gemm_nt(const Fp8Tensor& a, const Fp8Tensor& b_t, bool fast_accumulation = false,
                   at::ScalarType out = at::kFloat);

#if TE_HAS_FLOAT8
/// The codes as LibTorch's float8_e4m3fn / float8_e5m2 (the same bits; no scale applied).
at::Tensor to_torch_float8(const Fp8Tensor& t);
/// Wraps a Float8 tensor's bits, with `scale_inv`, as an Fp8Tensor.
Fp8Tensor from_torch_float8(const at::Tensor& t, const at::Tensor& scale_inv);
#endif

// ---- modules ----------------------------------------------------------------------------------

/// The FP8 state of one GEMM y = x @ w: forward slots [input, kernel] and backward slot [grad
/// output], each with scale, scale_inv and an amax history of the recipe's length (resized when a
/// recipe with another length first runs). Also caches the kernel's codes while the kernel and
/// its scale buffer are unchanged (micro-steps of one region, inference); a scale update casts
/// again. Plain tensors here: a module binds them as its buffers, so they are saved, loaded and
/// cloned with it (te::nn::ShardedModule::register_fp8_gemm).
class GemmMeta {
 public:
  at::Tensor fwd_scale, fwd_scale_inv, fwd_amax_history;  // [2], [2], [L, 2]
  at::Tensor bwd_scale, bwd_scale_inv, bwd_amax_history;  // [1], [1], [L, 1]

  /// New state with unit scales and zero histories of `history_len`; `prefix` names the GEMM (its
  /// buffers are <prefix>fp8_{fwd,bwd}_{scale,scale_inv,amax_history} where a module holds them).
  static std::shared_ptr<GemmMeta> make(const std::string& prefix, int64_t history_len = 1024);

  struct KernelCache {
    at::Storage storage;  // held, so its address cannot be reused by another tensor
    const void* data = nullptr;
    std::vector<int64_t> strides;
    int64_t version = -1;
    const void* scale_data = nullptr;  // fwd_scale's buffer and its version when cast
    int64_t scale_version = -1;
    DType dtype = DType::kE4M3;
    Fp8Tensor codes;       // [K, N]
    Fp8Tensor transposed;  // [N, K]
    at::Tensor amax;
  };
  KernelCache kernel_cache;  ///< internal
  int64_t kernel_cache_hits = 0;
  /// Guards the cache and every read or write of the buffers by te::fp8 (threads may share a
  /// module, e.g. in an inference server); the casts themselves run outside it.
  std::mutex mutex;

  /// FP8 weights for inference (see freeze_kernel): the kernel's E4M3 codes (its shape) and their
  /// scale_inv [1] (a module holds them as <prefix>fp8_kernel and <prefix>fp8_kernel_scale_inv).
  /// Undefined until frozen.
  at::Tensor frozen_kernel, frozen_kernel_scale_inv;
  bool frozen() const { return frozen_kernel.defined(); }

  /// FP8 weights in training (hold_kernel, TE's quantized_model_init with fp32 master weights):
  /// this rank's piece of the kernel as E4M3 codes (the piece's shape) with the whole kernel's one
  /// scale_inv, used by every FP8 GEMM of this state in place of casting the kernel, and the
  /// master piece (the fp32 kernel parameter the optimizer steps) they were cast from. Undefined
  /// until held.
  Fp8Tensor held_kernel;
  struct MasterStamp {
    at::Storage storage;  // held, so its address cannot be reused by another tensor
    const void* data = nullptr;
    int64_t version = -1;
  };
  MasterStamp held_from;  ///< internal
  /// The recipe whose weight_scale rule the held codes were cast by.
  std::optional<Recipe> held_recipe;
  bool holds_kernel() const { return held_kernel.data.defined(); }

  /// The prefix of the state's buffer names; it names the GEMM in messages ("<prefix>kernel").
  std::string prefix;
  /// Whether the GEMM's owner is training (set by the module that binds this state); unset:
  /// always.
  std::function<bool()> training;
};

/// Whether a GEMM of `meta` records its amaxes (and so moves the scales) now: in training (the
/// owner training (GemmMeta::training), outside c10::InferenceMode) and while calibrating.
/// Otherwise the FP8 path casts with the stored scales and records nothing, so a call's result
/// never depends on other calls or their order (threads sharing a module in a server).
bool records(const GemmMeta& meta);

/// Inference with FP8 weights: quantizes the kernel `w` [K, ...] to E4M3 with a scale from its own
/// amax into meta.frozen_kernel and frozen_kernel_scale_inv (a quarter of fp32's bytes; refilled
/// in place when frozen before), and makes every later GEMM of `meta` use them (frozen_linear).
/// Needs stored input scales, from FP8 training or calibration; throws te::Error naming the buffer
/// when they are missing. The caller releases its fp32 kernel (see te::nn::freeze_fp8_weights).
void freeze_kernel(GemmMeta& meta, const at::Tensor& w);
/// The check freeze_kernel makes first: te::Error naming the buffer when `meta` has no stored
/// input scale.
void check_freezable(const GemmMeta& meta);
/// Makes empty frozen tensors of the kernel's shape (unless frozen already), for load_checkpoint
/// to fill from a checkpoint saved after freezing.
void prepare_frozen_kernel(GemmMeta& meta, const std::vector<int64_t>& shape);

/// y = x @ kernel with the frozen FP8 kernel: x cast to E4M3 with the stored input scale
/// (fwd_scale[0]); an FP8 GEMM; nothing recorded. Inference only: throws when x requires grad.
at::Tensor frozen_linear(const at::Tensor& x, const GemmMeta& meta);

/// FP8 weights in training (TE's quantized_model_init, cast_master_weights_to_fp8): casts
/// `master` (this rank's piece of the kernel) to E4M3 with the scale the recipe gives the whole
/// kernel's `amax` (fp32 [1], reduced over the ranks holding pieces by the caller:
/// te::nn::requantize_fp8_weights), into meta.held_kernel, and stamps the master. Every later FP8
/// GEMM of `meta` takes these codes (and their transpose) instead of casting its kernel, its
/// gradient still flowing to the master; once the master changes (an optimizer step, a load) the
/// GEMM throws until it is held again (a write the version counter does not see, through
/// .data() or variable_data(), goes unnoticed). An autocast with another recipe than `recipe` is
/// refused by name. Per-tensor recipes only (delayed, current): te::Error naming the recipe
/// otherwise.
void hold_kernel(GemmMeta& meta, const at::Tensor& master, const at::Tensor& amax,
                 const Recipe& recipe);
/// The checks hold_kernel makes of a GEMM and its master: te::Error naming the kernel when it holds
/// frozen inference weights, or the master is not a contiguous floating tensor of 2+ dims.
void check_holdable_kernel(const GemmMeta& meta, const at::Tensor& master);
/// Drops the held codes: the GEMMs cast the kernel again.
void release_held_kernel(GemmMeta& meta);
/// te::Error naming `recipe` unless it can hold FP8 weights in training (a per-tensor recipe).
void check_holdable(const Recipe& recipe);

/// How a held kernel's codes reach the layout its GEMM uses, and its gradient the master piece:
/// `gather` maps this rank's piece of the codes (the master's shape, uint8) to the codes the GEMM
/// multiplies (FSDP: all-gathered, a quarter of fp32's bytes); `route_grad` maps the kernel
/// gradient in that layout (the master's dtype, gather's output shape) to the master piece's
/// (FSDP: reduce-scattered). Unset: the piece is used as it is (the caller routes the gradient
/// through the master, e.g. a layout change whose backward sums data-parallel gradients).
struct KernelMoves {
  std::function<at::Tensor(const at::Tensor&)> gather;
  std::function<at::Tensor(const at::Tensor&)> route_grad;
};

/// y = x @ w (x [..., K], w [K, N]) with autograd, its GEMMs in FP8 per the current
/// Fp8Autocast: x and w cast to the forward format, the output gradient to the backward format,
/// dgrad and wgrad both FP8 GEMMs. When records(meta), records amaxes into `meta` and schedules
/// their reduction over `mesh` (the current mesh when null) and update: at the end of the autocast
/// region and at the end of backward; otherwise casts with the stored scales. x and w are this
/// rank's local pieces. Needs fp8_enabled(), or fp8_calibrating() (then only the amaxes are
/// recorded and y = x @ w in high precision).
/// When `meta` holds its kernel (hold_kernel) and FP8 is enabled, `w` is the master piece (any
/// shape; the gradient comes back in it): the GEMMs take the held codes, moved by `moves`
/// (gathered again in backward rather than kept), and x is cast by the recipe alone.
/// `amax_dims`: the dims of `mesh` a whole tensor's amax is reduced over; nullptr: every dim but
/// the pipeline's. A mixture of experts' GEMMs leave out the expert-parallel dim, whose ranks
/// run other experts; every rank of the remaining dims must make the same calls, a group of no
/// rows included.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const std::shared_ptr<GemmMeta>& meta,
                  const DeviceMesh* mesh = nullptr, const KernelMoves* moves = nullptr,
                  const std::vector<int64_t>* amax_dims = nullptr);

/// The state of one Fp8Autocast region (defined in autocast.cpp).
struct Region;

}  // namespace te::fp8

namespace te {

/// RAII: makes FP8 (enabled or not) and `recipe` current on this thread until destroyed; nests
/// (the innermost wins). With a MeshResource it also opens that MeshResourceScope, so
/// extend_logical_axis_rules works inside. When the outermost enabled region ends, the forward
/// amaxes its GEMMs recorded are reduced (MAX, one all-reduce over every axis of the mesh they
/// ran on except the MeshResource's pp) and the DelayedScaling scales updated; backward amaxes
/// are reduced and their scales updated when the backward pass ends. Destroyed while an
/// exception unwinds, it skips its reduction (the other ranks may never reach theirs).
class Fp8Autocast {
 public:
  /// With `calibrating`, the GEMMs of modules with FP8 state record their amaxes even in eval
  /// mode or under InferenceMode, and the region's end turns them into DelayedScaling scales, as
  /// training does; with `enabled` false the GEMMs themselves stay in high precision (calibrate a
  /// model trained without FP8 before serving it in FP8).
  explicit Fp8Autocast(bool enabled = true, fp8::Recipe recipe = fp8::DelayedScaling{},
                       std::optional<MeshResource> mesh_resource = std::nullopt,
                       bool calibrating = false);
  ~Fp8Autocast() noexcept(false);
  Fp8Autocast(const Fp8Autocast&) = delete;
  Fp8Autocast& operator=(const Fp8Autocast&) = delete;

 private:
  std::optional<MeshResourceScope> resource_scope_;
  std::shared_ptr<fp8::Region> region_;
  int uncaught_ = 0;
};

/// True inside an enabled Fp8Autocast (the innermost one decides).
bool fp8_enabled();
/// True inside a calibrating Fp8Autocast (the innermost one decides).
bool fp8_calibrating();
/// The recipe of the innermost Fp8Autocast, if any.
std::optional<fp8::Recipe> fp8_recipe();

}  // namespace te
