#pragma once

// Process-level settings: intra-op threads and a description of what this build runs on.

#include <string>

namespace te {

/// Sets LibTorch's intra-op thread count: OMP_NUM_THREADS when it is set (a positive integer),
/// otherwise the number of cores divided by the ranks a launcher started on this host
/// (read_launch_environment's local_world_size: LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE or
/// SLURM's tasks on this node), at least one. LibTorch alone starts with one thread on some builds
/// (Debian's), which makes every GEMM single-core. Returns the count in force. Throws te::Error
/// when OMP_NUM_THREADS is set but is not a positive integer, or a launcher variable is malformed.
int configure_threads();

/// Keeps freed memory in the process for reuse (glibc's malloc; elsewhere a no-op returning
/// false): blocks below 32 MiB come from the heap rather than from their own mmap, and the heap
/// is handed back to the system only when over 1 GiB of it is free. A decode step allocates and
/// frees the same activations, logits and gathered keys every step; with glibc's defaults (a
/// dynamic mmap threshold and a trim threshold of twice it) those blocks went back to the kernel
/// and came again as fresh zeroed pages: a 32-stream bench_generate run took 2.4 million page
/// faults and 24% more CPU time than with this (docs/results.md). With `large_blocks_too`, blocks
/// of any size come from the main heap (glibc still maps a non-main thread's arena blocks over
/// 64 MiB): a training step frees and allocates activations, logits and gradients of hundreds of
/// MiB each step, and te-train's SmolLM2-135M bf16 step (4 x 256 tokens, 2 cores) ran at ~2x the
/// tokens/s with it than with the 32 MiB threshold alone (docs/results.md, Training). Process-wide, so for programs, not
/// libraries: te-serve, te-generate and te-embed call it at start, the training programs
/// (te::program::run_main) with large_blocks_too. Returns whether it took (false, changing
/// nothing, where GLIBC_TUNABLES or MALLOC_{MMAP,TRIM}_THRESHOLD_ is set).
bool keep_freed_memory(bool large_blocks_too = false);

/// One line per fact: te-cpp and LibTorch versions, CUDA support compiled in, intra-op threads,
/// and the BLAS LibTorch was built with.
std::string build_info();

}  // namespace te
