#pragma once

// at::parallel_for for te's CPU kernels. LibTorch's headers define it inline: under its OpenMP
// backend the loop is split over LibTorch's threads only in a file compiled with OpenMP, and runs
// on the calling thread otherwise. Include this (not ATen/Parallel.h) where a loop is split, and
// list the file in te_parallel_sources (cmake/TeParallel.cmake): the build stops here when a
// file would run its loops on one thread.

#include <ATen/Parallel.h>

#if AT_PARALLEL_OPENMP && !defined(INTRA_OP_PARALLEL)
#error "this file splits loops with at::parallel_for: list it in te_parallel_sources (CMake)"
#endif
