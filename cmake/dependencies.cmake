# Every dependency comes from Debian's packages (scripts/install-deps.sh).
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)

# Boost is linked statically so binaries built here run on hosts without Boost.Fiber.
set(Boost_USE_STATIC_LIBS ON)
find_package(Boost 1.74 REQUIRED COMPONENTS fiber context)
# libferry.so links Boost shared instead: a target with FERRY_SHARED_DEPS set gets these.
find_library(FERRY_BOOST_FIBER_SHARED NAMES libboost_fiber.so.${Boost_VERSION_MAJOR}.${Boost_VERSION_MINOR}.${Boost_VERSION_PATCH} libboost_fiber.so)
find_library(FERRY_BOOST_CONTEXT_SHARED NAMES libboost_context.so.${Boost_VERSION_MAJOR}.${Boost_VERSION_MINOR}.${Boost_VERSION_PATCH} libboost_context.so)
add_library(ferry_boost INTERFACE)
target_link_libraries(ferry_boost INTERFACE
  "$<IF:$<BOOL:$<TARGET_PROPERTY:FERRY_SHARED_DEPS>>,${FERRY_BOOST_FIBER_SHARED},Boost::fiber>"
  "$<IF:$<BOOL:$<TARGET_PROPERTY:FERRY_SHARED_DEPS>>,${FERRY_BOOST_CONTEXT_SHARED},Boost::context>")
target_include_directories(ferry_boost INTERFACE ${Boost_INCLUDE_DIRS})
find_package(msgpack CONFIG REQUIRED)          # target msgpackc-cxx
find_package(fmt CONFIG REQUIRED)              # used header-only: no libfmt soname to ship
find_package(CLI11 CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
pkg_check_modules(libfabric REQUIRED IMPORTED_TARGET libfabric)
# libsodium (HMAC for the peer handshake), linked statically for the same reason as Boost.
pkg_check_modules(libsodium REQUIRED IMPORTED_TARGET libsodium)
find_library(FERRY_SODIUM_STATIC NAMES libsodium.a)
if(FERRY_SODIUM_STATIC)
  set_target_properties(PkgConfig::libsodium PROPERTIES INTERFACE_LINK_LIBRARIES "${FERRY_SODIUM_STATIC}")
endif()
# tcmalloc (libgoogle-perftools-dev), static, for the `ferry` command only: a simulation's actors
# allocate per message and per chunk, and glibc's malloc took a quarter of its time
# (bench/results/sim_scale.md). Not under sanitizers, which bring their own allocator.
find_library(FERRY_TCMALLOC_STATIC NAMES libtcmalloc_minimal.a)

# CUDA and NCCL live in /usr/local/cuda when present; without them the build is CPU-only.
set(FERRY_WITH_CUDA OFF)
if(NOT FERRY_CUDA STREQUAL "OFF")
  # FindCUDAToolkit takes its hint as CUDAToolkit_ROOT (HINTS would switch to config mode and miss).
  if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  find_library(FERRY_NCCL_LIBRARY nccl HINTS /usr/local/cuda/lib64 ${CUDAToolkit_LIBRARY_DIR})
  find_path(FERRY_NCCL_INCLUDE nccl.h HINTS /usr/local/cuda/include ${CUDAToolkit_INCLUDE_DIRS})
  if(CUDAToolkit_FOUND AND FERRY_NCCL_LIBRARY AND FERRY_NCCL_INCLUDE)
    set(FERRY_WITH_CUDA ON)
    add_library(ferry_nccl INTERFACE)
    target_include_directories(ferry_nccl INTERFACE ${FERRY_NCCL_INCLUDE})
    target_link_libraries(ferry_nccl INTERFACE ${FERRY_NCCL_LIBRARY} CUDA::cudart_static)
  elseif(FERRY_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FERRY_CUDA=ON but CUDA or NCCL was not found in /usr/local/cuda")
  endif()
endif()
message(STATUS "ferry: CUDA/NCCL path ${FERRY_WITH_CUDA}")

# Every Python the build runs (tests, the module) is Debian's, which has python3-torch, numpy and
# msgpack; a pyenv `python3` first on PATH has none of them.
if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python3_EXECUTABLE /usr/bin/python3)
endif()
