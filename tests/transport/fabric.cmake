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

# The link layer's pieces that need no provider: message format, sessions (handshake and seals,
# with a seeded faulty wire), fragment assembly, per-peer traffic and stalls on virtual time.
ferry_test(fabric_link_test
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/frame_assembly_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/link_sessions_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/message_format_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/peer_traffic_test.cpp
  LABELS fabric)
