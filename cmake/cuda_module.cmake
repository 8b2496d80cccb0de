# The CUDA backend module, lib/strata/libstrata_cuda.so: src/backends/cuda (the seam's CUDA side and its
# entry point) over kernels/cuda. The executable dlopens it at run time after loading the CUDA
# libraries it names (src/backends/cuda_loader), so bin/strata itself needs no CUDA library to start.
# Its undefined symbols (the Comm base class, the watchdog's marks, ...) bind to the
# executable's, which exports them (ENABLE_EXPORTS); everything it defines stays local
# (src/backends/cuda/cuda_module.map), so its seam functions never bind to the executable's forwarding
# functions of the same names.
file(GLOB STRATA_CUDA_MODULE_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/backends/cuda/*.cpp)
add_library(strata_cuda MODULE ${STRATA_CUDA_MODULE_SOURCES})
# src: the seam's private header it implements (backends/cuda_api.h).
target_include_directories(strata_cuda PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/src)
target_compile_definitions(strata_cuda PRIVATE
  STRATA_VERSION="${PROJECT_VERSION}")
target_compile_options(strata_cuda PRIVATE ${STRATA_WARNINGS})
set(STRATA_CUDA_MODULE_MAP ${CMAKE_SOURCE_DIR}/src/backends/cuda/cuda_module.map)
target_link_options(strata_cuda PRIVATE -Wl,--version-script=${STRATA_CUDA_MODULE_MAP})
# Its own copy of git_commit() (local, as everything it defines): its build string says which
# build it is from, not the executable's.
target_link_libraries(strata_cuda PRIVATE strata_version strata_kernels_cuda strata_nccl fmt::fmt)
# In the build tree the module sits beside the executable; installed, in LIBDIR/strata. Its
# own RPATH names no CUDA directory: the loader has loaded those libraries before it.
set_target_properties(strata_cuda PROPERTIES
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}
  LINK_DEPENDS ${STRATA_CUDA_MODULE_MAP}
  BUILD_RPATH "" SKIP_BUILD_RPATH ON
  INSTALL_RPATH "$ORIGIN/..;${CMAKE_INSTALL_RPATH}"
  CUDA_RUNTIME_LIBRARY Shared)
set_target_properties(strata PROPERTIES ENABLE_EXPORTS ON)
add_dependencies(strata strata_cuda)  # building strata builds its backend

file(RELATIVE_PATH STRATA_CUDA_MODULE_REL ${CMAKE_INSTALL_FULL_BINDIR}
     ${CMAKE_INSTALL_FULL_LIBDIR}/strata/libstrata_cuda.so)
set_source_files_properties(${CMAKE_SOURCE_DIR}/src/backends/cuda_loader/cuda_backend.cpp PROPERTIES
  COMPILE_DEFINITIONS STRATA_CUDA_MODULE_REL="${STRATA_CUDA_MODULE_REL}")
install(TARGETS strata_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/strata)
