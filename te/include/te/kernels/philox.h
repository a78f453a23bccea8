#pragma once

// Counter-based random numbers (the kernels layer: no LibTorch). Philox 4x32-10 (Salmon et al.,
// "Parallel random numbers: as easy as 1, 2, 3", SC'11; the generator cuRAND and PyTorch's CUDA
// generator use): a pure function of a 128-bit counter and a 64-bit key, so any element of a
// random tensor can be computed on its own, by any rank, in any order.
//
// te's random ops number the elements of the *global* tensor row-major and give element g the
// output lane g % 4 of the block at counter (g / 4, call): a rank that holds a piece of the
// tensor computes exactly the slice of the mask one process would draw for the whole tensor.

#include <array>
#include <cstdint>

namespace te::kernels {

/// One Philox 4x32-10 block: 4 independent uniform 32-bit words for (counter, key).
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

/// A row-major box inside a global tensor: the global sizes, and per dim the offset and length
/// of the box. `ndim` >= 1; the box's last dim is the contiguous one.
struct GlobalBox {
  const int64_t* global_sizes;
  const int64_t* offsets;
  const int64_t* lengths;
  int ndim;
};

/// Dropout multipliers for rows [row_begin, row_end) of `box` (a row: all of the box's last dim;
/// rows counted row-major over the other dims), written to out[(row - row_begin) * lengths[last]
/// ...]: `scale` where the element is kept, 0 where it is dropped. Element g of the global tensor
/// is dropped when its Philox word (seed, call) is below `drop_threshold` (p * 2^32, rounded).
void dropout_multipliers(const GlobalBox& box, int64_t row_begin, int64_t row_end, uint64_t seed,
                         uint64_t call, uint32_t drop_threshold, float scale, float* out);

/// The drop threshold of probability p in [0, 1): round(p * 2^32), so P(drop) = p within 2^-33.
uint32_t drop_threshold(double p);

/// The Philox word of global element g in call `call` under `seed`, from the element mapping the
/// CUDA kernel compiles too (dropout_multipliers computes the same words many at a time).
uint32_t dropout_word(uint64_t g, uint64_t seed, uint64_t call);
/// The words of elements 4 block .. 4 block + 3 at once (dropout_word's mapping), for a caller
/// walking consecutive elements.
std::array<uint32_t, 4> dropout_words(uint64_t block, uint64_t seed, uint64_t call);

namespace cuda {

/// The most dims dropout_apply takes.
constexpr int kMaxDropoutDims = 8;

/// out = in * multiplier, elementwise over `box` (contiguous, row-major, on the device), with
/// exactly dropout_multipliers' multipliers: a CUDA tensor's dropout draws what the CPU draws,
/// and backward (the same call on the gradient) needs no stored mask. `dtype`: 0 float,
/// 1 half, 2 bfloat16; in may equal out. `stream` is a cudaStream_t (null: the default stream).
/// Built with the CUDA toolkit (TE_WITH_CUDA).
void dropout_apply(const GlobalBox& box, uint64_t seed, uint64_t call, uint32_t drop_threshold,
                   float scale, const void* in, void* out, int dtype, void* stream);

}  // namespace cuda

}  // namespace te::kernels
