# Decides TE_WITH_CUDA. AUTO enables CUDA when a toolkit (nvcc) is found; ON requires one; OFF
# never looks. CUDA code must compile and link wherever a toolkit exists, GPU or not.
set(TE_WITH_CUDA OFF)
option(TE_REQUIRE_NCCL "Fail the configure when CUDA is on but NCCL is not found" OFF)
option(TE_REQUIRE_CUDNN "Fail the configure when CUDA is on but cuDNN is not found" OFF)
if(NOT TE_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Ada (FP8 cuBLASLt) and Hopper; override with -DCMAKE_CUDA_ARCHITECTURES=...
      set(CMAKE_CUDA_ARCHITECTURES 89 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    find_package(NCCL)
    find_package(CUDNN)
    set(TE_WITH_CUDA ON)
    # A GPU check must not pass with parts silently missing (scripts/gpu-check.sh sets these).
    if(TE_REQUIRE_NCCL AND NOT NCCL_FOUND)
      message(FATAL_ERROR "TE_REQUIRE_NCCL=ON but NCCL was not found (nccl.h and libnccl): set "
                          "NCCL_ROOT to its folder (pip: site-packages/nvidia/nccl)")
    endif()
    if(TE_REQUIRE_CUDNN AND NOT CUDNN_FOUND)
      message(FATAL_ERROR "TE_REQUIRE_CUDNN=ON but cuDNN was not found (cudnn.h and libcudnn): "
                          "set CUDNN_ROOT to its folder (pip: site-packages/nvidia/cudnn)")
    endif()
    message(STATUS "te: CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}; "
                   "NCCL ${NCCL_VERSION} (${NCCL_FOUND}), cuDNN ${CUDNN_VERSION} (${CUDNN_FOUND})")
  elseif(TE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TE_CUDA=ON but no CUDA compiler was found: put nvcc on PATH or set "
                        "CMAKE_CUDA_COMPILER, or configure with -DTE_CUDA=AUTO/OFF")
  endif()
endif()
