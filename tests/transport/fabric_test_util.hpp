#pragma once
/// Helpers shared by the fabric transport tests and their peer process.
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string_view>

#include "runtime/codec.hpp"
#include "runtime/event_loop.hpp"
#include "transport/link_auth.hpp"

namespace ferry::fabric_test {

/// The job secret of the fabric tests and their peer process.
inline job_secret test_secret() {
  constexpr std::string_view text = "ferry fabric tests: a job secret";
  const auto* p = reinterpret_cast<const std::byte*>(text.data());
  return job_secret(p, p + text.size());
}

/// Runs `loop` until `done()` holds or `limit` passed; true when `done()` held.
inline bool run_for(event_loop& loop, const std::function<bool()>& done,
                    std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  auto expired = std::make_shared<bool>(false);
  asio::steady_timer timer(loop.io());
  timer.expires_after(limit);
  timer.async_wait([expired](const boost::system::error_code& ec) {
    if (!ec) *expired = true;
  });
  loop.run_until([&] { return done() || *expired; });
  return done();
}

/// A control frame carrying `text` (4-byte prefix + bytes); the transport does not decode it.
inline frame text_frame(std::string_view text) {
  frame f(frame_prefix_bytes + text.size());
  std::memcpy(f.data() + frame_prefix_bytes, text.data(), text.size());
  const auto n = static_cast<std::uint32_t>(text.size());
  for (int i = 0; i < 4; ++i) f[i] = static_cast<std::byte>(n >> (24 - 8 * i));
  return f;
}

inline std::string_view as_text(std::span<const std::byte> payload) {
  return {reinterpret_cast<const char*>(payload.data()), payload.size()};
}

/// The expected content of byte `i` of a test transfer with `seed`: cheap, position-dependent.
inline std::uint64_t pattern_word(std::uint64_t word, std::uint64_t seed) {
  std::uint64_t z = word + seed * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline void fill_pattern(std::span<std::byte> bytes, std::uint64_t seed) {
  const std::size_t words = bytes.size() / 8;
  for (std::size_t w = 0; w < words; ++w) {
    const auto v = pattern_word(w, seed);
    std::memcpy(bytes.data() + 8 * w, &v, 8);
  }
  for (std::size_t i = words * 8; i < bytes.size(); ++i)
    bytes[i] = static_cast<std::byte>(pattern_word(i, seed + 1));
}

/// Index of the first byte that differs from the pattern, or `bytes.size()` if none.
inline std::size_t first_mismatch(std::span<const std::byte> bytes, std::uint64_t seed) {
  const std::size_t words = bytes.size() / 8;
  for (std::size_t w = 0; w < words; ++w) {
    const auto v = pattern_word(w, seed);
    if (std::memcmp(bytes.data() + 8 * w, &v, 8) != 0) return 8 * w;
  }
  for (std::size_t i = words * 8; i < bytes.size(); ++i)
    if (bytes[i] != static_cast<std::byte>(pattern_word(i, seed + 1))) return i;
  return bytes.size();
}

}  // namespace ferry::fabric_test
