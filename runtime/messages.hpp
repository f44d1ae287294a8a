#pragma once
/// The runtime's own messages.
#include <cstdint>
#include <string>

#include "runtime/message.hpp"

namespace ferry {

/// Liveness probe and echo; `payload` comes back in the pong.
struct ping {
  static constexpr msg_kind kind{1};
  std::uint64_t nonce = 0;
  std::string payload;
  FERRY_DEFINE_MAP(nonce, payload)
};

struct pong {
  static constexpr msg_kind kind{2};
  std::uint64_t nonce = 0;
  std::string payload;
  FERRY_DEFINE_MAP(nonce, payload)
};

}  // namespace ferry
