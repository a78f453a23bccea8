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

/// One line per fact: te-cpp and LibTorch versions, CUDA support compiled in, intra-op threads,
/// and the BLAS LibTorch was built with.
std::string build_info();

}  // namespace te
