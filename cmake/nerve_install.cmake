# `cmake --install` and find_package(nerve): headers, libraries, the CUDA module and a
# CMake package with the targets nerve::actors, nerve::bus, nerve::layers,
# nerve::schedule, nerve::pipeline, nerve::gpu and nerve::gpu_layers (docs/api.md,
# "Using an installed nerve"). Included by the root CMakeLists.txt once the library
# folders are configured.
#
#   <prefix>/include/nerve/{actors,bus,gpu,layers}/...   the targets' include dir is
#                                                        include/nerve, so user code keeps
#                                                        writing "actors/runtime.hpp"
#   <prefix>/lib/libnerve_*.{so,a}, libnerve_gpu_cuda.so (CUDA builds)
#   <prefix>/bin/nerve-train, nerve-pipeline, nerve-generate, nerve-trace (with the apps;
#                                                        nerve_install_app below)
#   <prefix>/lib/cmake/nerve/nerveConfig.cmake, nerveConfigVersion.cmake, nerveTargets*.cmake,
#                                                        nerveApps*.cmake (the programs)
#
# Shared or static: BUILD_SHARED_LIBS decides, as for any CMake project. Shared is what
# scripts/example installs and tests, and what we recommend: the CUDA module is found
# beside libnerve_gpu.so (gpu/detail/module.hpp), OpenBLAS stays a private dependency,
# and one copy of nerve's process-wide state (error categories, recorder chunks) serves
# every library of a program. Static archives work too: their link interface names
# OpenBLAS, which nerveConfig.cmake finds again, and nerve::gpu then carries an rpath to
# the install's lib folder, where the executable's dlopen finds the CUDA module.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(NERVE_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/nerve CACHE STRING
    "Where nerveConfig.cmake is installed, relative to the prefix")

set(_nerve_exported nerve_actors nerve_bus nerve_layers nerve_schedule nerve_pipeline nerve_gpu nerve_gpu_layers)
get_target_property(_nerve_layers_type nerve_layers TYPE)
set(NERVE_INSTALL_SHARED OFF)
if(_nerve_layers_type STREQUAL "SHARED_LIBRARY")
  set(NERVE_INSTALL_SHARED ON)
endif()

foreach(_t IN LISTS _nerve_exported)
  string(REGEX REPLACE "^nerve_" "" _name ${_t})
  set_target_properties(${_t} PROPERTIES
    EXPORT_NAME ${_name}
    # No <target>_EXPORTS macro (nothing reads it): a shared build then compiles every
    # object exactly as the static build does, and ccache serves both.
    DEFINE_SYMBOL ""
    # Installed shared libraries find each other in their own folder.
    INSTALL_RPATH "$ORIGIN"
    VERSION ${PROJECT_VERSION}
    SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
endforeach()

# Static archives list their PRIVATE dependencies as link-only: nerve_warnings (flags
# only, nothing to link) must then be exported too, and OpenBLAS found again.
set(_nerve_export_also "")
if(NOT NERVE_INSTALL_SHARED)
  set(_nerve_export_also nerve_warnings)
  set_target_properties(nerve_warnings PROPERTIES EXPORT_NAME warnings)
endif()
get_target_property(_nerve_layers_links nerve_layers LINK_LIBRARIES)
get_target_property(_nerve_layers_iface nerve_layers INTERFACE_LINK_LIBRARIES)
set(NERVE_INSTALL_OPENBLAS OFF)
if(NOT NERVE_INSTALL_SHARED AND "PkgConfig::NERVE_OPENBLAS" IN_LIST _nerve_layers_links)
  set(NERVE_INSTALL_OPENBLAS ON)
endif()
set(NERVE_INSTALL_OPENMP OFF)
if("OpenMP::OpenMP_CXX" IN_LIST _nerve_layers_iface)
  set(NERVE_INSTALL_OPENMP ON)
endif()

# The instruction set. In the build tree nerve::layers passes -march=${NERVE_ARCH} to
# everything that links it (layers/CMakeLists.txt), so that every translation unit
# agrees on Eigen's alignment. An installed package does not pass it on: `native` would
# mean the user's machine, not the one nerve was built for, and a user's code should
# not be compiled for an ISA it did not ask for. What must agree is Eigen's alignment,
# so the installed nerve::layers defines the two Eigen macros to the values nerve itself
# was compiled with (read from the preprocessor here, with the same -march). The
# libraries still run the instructions NERVE_ARCH allowed: build with -DNERVE_ARCH=
# (compiler default) or e.g. x86-64-v3 for a package meant for other machines.
set(_nerve_arch_flag "")
if(NERVE_ARCH)
  set(_nerve_arch_flag -march=${NERVE_ARCH})
endif()
get_target_property(_nerve_eigen_dirs Eigen3::Eigen INTERFACE_INCLUDE_DIRECTORIES)
list(TRANSFORM _nerve_eigen_dirs PREPEND -I)
set(_nerve_probe ${CMAKE_CURRENT_BINARY_DIR}/nerve_eigen_align.cpp)
file(WRITE ${_nerve_probe} "#include <Eigen/Core>\nnerve_eigen_align EIGEN_MAX_ALIGN_BYTES EIGEN_MAX_STATIC_ALIGN_BYTES\n")
execute_process(
  COMMAND ${CMAKE_CXX_COMPILER} -std=c++20 ${_nerve_arch_flag} ${_nerve_eigen_dirs} -E -P ${_nerve_probe}
  OUTPUT_VARIABLE _nerve_probe_out ERROR_VARIABLE _nerve_probe_err RESULT_VARIABLE _nerve_probe_rc)
if(NOT _nerve_probe_rc EQUAL 0 OR NOT _nerve_probe_out MATCHES "nerve_eigen_align ([0-9]+) ([0-9]+)")
  message(FATAL_ERROR "nerve: cannot read Eigen's alignment for ${_nerve_arch_flag}: ${_nerve_probe_err}")
endif()
set(NERVE_EIGEN_MAX_ALIGN_BYTES ${CMAKE_MATCH_1})
set(NERVE_EIGEN_MAX_STATIC_ALIGN_BYTES ${CMAKE_MATCH_2})
# For find_package's message: what `native` was on the build machine (GCC can say).
set(NERVE_ARCH_NAME "${NERVE_ARCH}")
if(NERVE_ARCH STREQUAL "native" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -march=native -Q --help=target
                  OUTPUT_VARIABLE _nerve_target_help ERROR_QUIET)
  if(_nerve_target_help MATCHES "-march=[ \t]+([^ \t\n]+)")
    set(NERVE_ARCH_NAME "native (${CMAKE_MATCH_1} on the machine that built it)")
  endif()
endif()
target_compile_definitions(nerve_layers INTERFACE
  $<INSTALL_INTERFACE:EIGEN_MAX_ALIGN_BYTES=${NERVE_EIGEN_MAX_ALIGN_BYTES}>
  $<INSTALL_INTERFACE:EIGEN_MAX_STATIC_ALIGN_BYTES=${NERVE_EIGEN_MAX_STATIC_ALIGN_BYTES}>)

# The CUDA module and the NCCL module (MODULEs, not exported targets: nothing links them,
# nerve::gpu dlopens them). They keep their rpath to the CUDA toolkit's libraries.
if(TARGET nerve_gpu_cuda)
  foreach(_module nerve_gpu_cuda nerve_gpu_nccl)
    if(TARGET ${_module})
      set_target_properties(${_module} PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
      install(TARGETS ${_module} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
    endif()
  endforeach()
  if(NOT NERVE_INSTALL_SHARED)
    # Static nerve::gpu lives in the user's executable, whose folder holds no module:
    # its rpath lets dlopen("libnerve_gpu_cuda.so") find the installed one.
    target_link_options(nerve_gpu INTERFACE
      $<INSTALL_INTERFACE:LINKER:-rpath$<COMMA>$<INSTALL_PREFIX>/${CMAKE_INSTALL_LIBDIR}>)
  endif()
endif()

install(TARGETS ${_nerve_exported} ${_nerve_export_also} EXPORT nerveTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/nerve)

# Headers: every .hpp of the library folders, detail/ included (public headers include
# them), but not the backends' own (gpu/cuda, gpu/standin) nor kernels and benchmarks.
# NERVE_PUBLIC_HEADERS (paths from the root) is what tests/headers compiles one by one.
set(NERVE_PUBLIC_HEADERS "")
foreach(_dir actors bus gpu layers)
  file(GLOB_RECURSE _headers CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/${_dir}/*.hpp)
  list(FILTER _headers EXCLUDE REGEX "/(cuda|standin|kernels|bench)/")
  list(SORT _headers)
  list(APPEND NERVE_PUBLIC_HEADERS ${_headers})
endforeach()
foreach(_header IN LISTS NERVE_PUBLIC_HEADERS)
  get_filename_component(_folder ${_header} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${_header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/nerve/${_folder})
endforeach()

# Shared builds with MPI: nerve-train and nerve-pipeline link the MPI transport's
# libraries, which are not part of the package (no exported target): they are installed
# beside the others so that the installed programs start.
if(NERVE_INSTALL_SHARED)
  foreach(_t nerve_bus_mpi nerve_pipeline_mpi)
    if(TARGET ${_t})
      set_target_properties(${_t} PROPERTIES DEFINE_SYMBOL "" INSTALL_RPATH "$ORIGIN")
      install(TARGETS ${_t} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
    endif()
  endforeach()
endif()

# nerve_install_app(target): installs an app into <prefix>/bin as the imported executable
# nerve::<target> of find_package(nerve) (nerveApps.cmake, written by apps/CMakeLists.txt).
# Its rpath finds the shared libraries in <prefix>/lib wherever the prefix is moved; a
# static build links them in. What an app loads at run time is found from its libraries
# (the CUDA module beside libnerve_gpu, or ../lib from bin/ for a static build) or is
# compiled in (nerve-trace's pages).
function(nerve_install_app target)
  set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
  install(TARGETS ${target} EXPORT nerveApps RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endfunction()

install(EXPORT nerveTargets NAMESPACE nerve:: DESTINATION ${NERVE_INSTALL_CMAKEDIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/nerveConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/nerveConfig.cmake INSTALL_DESTINATION ${NERVE_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/nerveConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/nerveConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/nerveConfigVersion.cmake
  DESTINATION ${NERVE_INSTALL_CMAKEDIR})
