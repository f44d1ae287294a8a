# fabric_bench: ferry's fabric bulk path against plain fi_write and fi_writedata loops (owned by the fabric transport).
# Included from bench/CMakeLists.txt: include(${CMAKE_CURRENT_LIST_DIR}/fabric.cmake)
add_executable(fabric_bench ${CMAKE_CURRENT_LIST_DIR}/fabric_bench.cpp)
target_link_libraries(fabric_bench PRIVATE ferry PkgConfig::libfabric CLI11::CLI11)
