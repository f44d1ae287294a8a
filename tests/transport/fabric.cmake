# Tests of the libfabric transport (label `fabric`), on tcp;ofi_rxm and shm.
# Included from tests/transport/CMakeLists.txt: include(${CMAKE_CURRENT_LIST_DIR}/fabric.cmake)

# The receiving process of the two-process test.
add_executable(fabric_peer ${CMAKE_CURRENT_LIST_DIR}/fabric_peer.cpp)
target_link_libraries(fabric_peer PRIVATE ferry)

ferry_test(fabric_transport_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/fabric_transport_test.cpp
  LABELS fabric
  TIMEOUT 180)
target_compile_definitions(fabric_transport_test PRIVATE FERRY_FABRIC_PEER="$<TARGET_FILE:fabric_peer>")
add_dependencies(fabric_transport_test fabric_peer)
