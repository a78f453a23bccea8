# te's CPU kernels split their loops with at::parallel_for, which LibTorch's headers define inline.
# Under LibTorch's OpenMP backend (Debian's LibTorch, PyTorch's wheels) such a loop runs on
# LibTorch's threads only in a file compiled with OpenMP: compiled without, it runs the whole range
# on the calling thread (measured here: one thread of two). te_parallel_sources(target files...)
# compiles those files with OpenMP and links the target to the runtime LibTorch itself uses
# (libgomp: one copy per process by its soname, so at::set_num_threads sets te's threads too);
# te/runtime/parallel.h stops the build of a file that calls at::parallel_for without it.

set(TE_ATEN_OPENMP OFF)
find_file(TE_ATEN_CONFIG ATen/Config.h PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
if(TE_ATEN_CONFIG)
  file(STRINGS "${TE_ATEN_CONFIG}" te_aten_openmp REGEX "#define AT_PARALLEL_OPENMP 1")
  if(te_aten_openmp)
    find_package(OpenMP REQUIRED COMPONENTS CXX)
    set(TE_ATEN_OPENMP ON)
  endif()
endif()
message(STATUS "te: kernels on LibTorch's OpenMP threads: ${TE_ATEN_OPENMP}")

function(te_parallel_sources target)
  if(NOT TE_ATEN_OPENMP)
    return()
  endif()
  list(TRANSFORM ARGN PREPEND "${CMAKE_CURRENT_SOURCE_DIR}/")
  # (Not through the target's precompiled ATen headers: they were parsed without OpenMP.)
  set_property(SOURCE ${ARGN} TARGET_DIRECTORY ${target} APPEND PROPERTY COMPILE_OPTIONS
               ${OpenMP_CXX_FLAGS})
  set_property(SOURCE ${ARGN} TARGET_DIRECTORY ${target} PROPERTY SKIP_PRECOMPILE_HEADERS ON)
  target_link_libraries(${target} PUBLIC ${OpenMP_CXX_LIBRARIES})
endfunction()
