# STRATA_CUDA = AUTO | ON | OFF. AUTO builds the CUDA backend when nvcc, cuBLAS, cuDNN and NCCL
# are all found (CUDA 13, cuDNN 9 and NCCL 2.28 live in /usr/local/cuda on our machines); ON
# fails the configure naming what is missing; OFF never looks. Sets STRATA_HAVE_CUDA and, when
# on, the targets strata_kernels_cuda (kernels/cuda) and strata_nccl, from which
# cmake/cuda_module.cmake builds the backend module.
set(STRATA_HAVE_CUDA OFF)
if(STRATA_CUDA STREQUAL "OFF")
  message(STATUS "strata: CUDA backend off (STRATA_CUDA=OFF)")
  return()
endif()
if(NOT STRATA_CUDA MATCHES "^(AUTO|ON)$")
  message(FATAL_ERROR "STRATA_CUDA=${STRATA_CUDA}: expected AUTO, ON or OFF")
endif()

set(_missing "")
include(CheckLanguage)
if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  list(APPEND _missing "nvcc")
endif()
find_package(CUDAToolkit QUIET)
if(NOT TARGET CUDA::cublas)
  list(APPEND _missing "cuBLAS")
endif()
set(_cuda_hints ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib64 /usr/local/cuda/lib64)
set(_cuda_inc_hints ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
find_library(STRATA_CUDNN_LIBRARY cudnn HINTS ${_cuda_hints})
find_path(STRATA_CUDNN_INCLUDE cudnn.h HINTS ${_cuda_inc_hints})
if(NOT STRATA_CUDNN_LIBRARY OR NOT STRATA_CUDNN_INCLUDE)
  list(APPEND _missing "cuDNN")
endif()
find_library(STRATA_NCCL_LIBRARY nccl HINTS ${_cuda_hints})
find_path(STRATA_NCCL_INCLUDE nccl.h HINTS ${_cuda_inc_hints})
if(NOT STRATA_NCCL_LIBRARY OR NOT STRATA_NCCL_INCLUDE)
  list(APPEND _missing "NCCL")
endif()

if(_missing)
  if(STRATA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "STRATA_CUDA=ON but not found: ${_missing} (set CUDAToolkit_ROOT, or "
                        "CMAKE_LIBRARY_PATH for cuDNN/NCCL)")
  endif()
  message(STATUS "strata: CUDA backend off (STRATA_CUDA=AUTO; not found: ${_missing})")
  return()
endif()

# H100/H200 (sm_90 code, and compute_90 PTX that newer GPUs compile at load). Set before
# enable_language, which would otherwise pick nvcc's own default.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90)
endif()
enable_language(CUDA)
# CMake 3.25 predates nvcc 13 and knows no C++20 flag for it (targets get CUDA20 from the
# project's CXX_STANDARD and the generate step fails): tell it the flag nvcc takes.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
# As for C and C++ (CMakeLists.txt): __FILE__ relative to the source tree.
add_compile_options($<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-ffile-prefix-map=${CMAKE_SOURCE_DIR}/=>)
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_EXTENSIONS OFF)
set(STRATA_HAVE_CUDA ON)
message(STATUS "strata: CUDA backend on (CUDA ${CUDAToolkit_VERSION}, architectures "
               "${CMAKE_CUDA_ARCHITECTURES}, cuDNN ${STRATA_CUDNN_LIBRARY}, NCCL ${STRATA_NCCL_LIBRARY})")

# nvcc's own warnings and the host compiler's, errors like the C++ code's under STRATA_WERROR.
set(STRATA_CUDA_WARNINGS -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter)
if(STRATA_WERROR)
  list(APPEND STRATA_CUDA_WARNINGS --Werror=all-warnings -Xcompiler=-Werror)
endif()

add_library(strata_nccl INTERFACE)
target_include_directories(strata_nccl INTERFACE ${STRATA_NCCL_INCLUDE})
target_link_libraries(strata_nccl INTERFACE ${STRATA_NCCL_LIBRARY} CUDA::cudart)

file(GLOB STRATA_CUDA_KERNELS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cu)
add_library(strata_kernels_cuda STATIC ${STRATA_CUDA_KERNELS})
target_include_directories(strata_kernels_cuda PUBLIC ${CMAKE_SOURCE_DIR}/include
                           PRIVATE ${STRATA_CUDNN_INCLUDE})
target_compile_options(strata_kernels_cuda PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:${STRATA_CUDA_WARNINGS} -O3>
  $<$<COMPILE_LANGUAGE:CXX>:${STRATA_WARNINGS}>)
set_target_properties(strata_kernels_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON
                      CUDA_SEPARABLE_COMPILATION OFF)
target_link_libraries(strata_kernels_cuda PUBLIC CUDA::cudart CUDA::cublas CUDA::cublasLt
                      ${STRATA_CUDNN_LIBRARY} fmt::fmt)
target_compile_definitions(strata_kernels_cuda PUBLIC STRATA_HAVE_CUDA=1)
