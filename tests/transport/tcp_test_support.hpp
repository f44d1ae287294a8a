#pragma once
/// Helpers shared by the tcp transport tests: test-only messages (kinds 240-255), a byte
/// pattern, and a peer that speaks the link protocol by hand over a blocking socket.
#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/event_loop.hpp"
#include "runtime/message_registry.hpp"
#include "runtime/messages.hpp"
#include "runtime/transport.hpp"
#include "transport/link_auth.hpp"
#include "transport/tcp/link_protocol.hpp"

namespace ferry::test {

/// The child's greeting: where it listens and the region it offers for the bulk write.
struct peer_hello {
  static constexpr msg_kind kind{240};
  std::string address;
  region_desc region;
  FERRY_DEFINE_MAP(address, region)
};

/// The parent's bulk write completed; `hash` is the XXH3-64 of what it sent.
struct write_done {
  static constexpr msg_kind kind{241};
  std::uint64_t length = 0;
  std::uint64_t hash = 0;
  FERRY_DEFINE_MAP(length, hash)
};

/// What the child found in its region.
struct verdict {
  static constexpr msg_kind kind{242};
  bool ok = false;
  std::uint64_t length = 0;
  std::uint64_t hash = 0;
  std::uint64_t mismatched_words = 0;
  FERRY_DEFINE_MAP(ok, length, hash, mismatched_words)
};

/// The parent has what it needs; the child may exit.
struct bye {
  static constexpr msg_kind kind{243};
  std::uint32_t code = 0;
  FERRY_DEFINE_MAP(code)
};

/// A write landed in the child's region (cma tests); `mismatched_words` against the pattern.
struct landed {
  static constexpr msg_kind kind{244};
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::uint32_t imm = 0;
  std::uint64_t mismatched_words = 0;
  FERRY_DEFINE_MAP(offset, length, imm, mismatched_words)
};

/// Asks the child about a range of its region.
struct inspect {
  static constexpr msg_kind kind{245};
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  FERRY_DEFINE_MAP(offset, length)
};

/// The answer to `inspect`: how many bytes of the range are not zero.
struct region_report {
  static constexpr msg_kind kind{246};
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::uint64_t nonzero_bytes = 0;
  FERRY_DEFINE_MAP(offset, length, nonzero_bytes)
};

inline message_registry test_registry() {
  auto r = runtime_messages();
  r.add<peer_hello>("test.peer_hello");
  r.add<write_done>("test.write_done");
  r.add<verdict>("test.verdict");
  r.add<bye>("test.bye");
  r.add<landed>("test.landed");
  r.add<inspect>("test.inspect");
  r.add<region_report>("test.region_report");
  return r;
}

/// The imm tag of the bulk write under test.
inline constexpr std::uint8_t test_write_tag = 0xf0;

/// Word `i` of the test pattern: every 8-byte word differs, so misplaced bytes are caught.
inline std::uint64_t pattern_word(std::uint64_t i) {
  std::uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull;
  z ^= z >> 31;
  return z * 0xbf58476d1ce4e5b9ull;
}

/// The pattern from word `first_word` on: a write of bytes [8k, ...) of a patterned source keeps
/// the pattern at the same offset of the target.
inline void fill_pattern(std::span<std::byte> out, std::uint64_t first_word = 0) {
  for (std::size_t w = 0; w * 8 < out.size(); ++w) {
    const auto v = pattern_word(first_word + w);
    std::memcpy(out.data() + w * 8, &v, std::min<std::size_t>(8, out.size() - w * 8));
  }
}

/// Words of `in` that differ from the pattern.
inline std::uint64_t pattern_mismatches(std::span<const std::byte> in,
                                        std::uint64_t first_word = 0) {
  std::uint64_t bad = 0;
  for (std::size_t w = 0; w * 8 < in.size(); ++w) {
    const auto v = pattern_word(first_word + w);
    bad += std::memcmp(in.data() + w * 8, &v, std::min<std::size_t>(8, in.size() - w * 8)) != 0;
  }
  return bad;
}

/// A job secret for tests (32 bytes).
inline job_secret test_secret(char fill = 's') {
  return job_secret(32, static_cast<std::byte>(fill));
}

/// Runs what is queued on `loop` now, and what that queues before it ends (`run_until` checks its
/// condition first, so `run_until(true)` would run nothing).
inline void one_turn(event_loop& loop) {
  bool turned = false;
  loop.post([&] { turned = true; });
  loop.run_until([&] { return turned; });
}

inline std::uint16_t port_of(const std::string& address) {
  return static_cast<std::uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
}

/// A hand-driven link peer on a blocking socket; runs on a thread of its own, never on the
/// loop's thread. Reads give up after a receive timeout, so a test fails instead of hanging.
class raw_peer {
 public:
  using bytes = std::vector<std::byte>;

  /// Connects to 127.0.0.1:`port`.
  explicit raw_peer(std::uint16_t port) : socket_(io_) {
    socket_.connect({boost::asio::ip::make_address("127.0.0.1"), port});
    timeval tv{.tv_sec = 10, .tv_usec = 0};
    ::setsockopt(socket_.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  /// Adopts an accepted socket (for a hand-driven listener).
  explicit raw_peer(boost::asio::ip::tcp::socket s) : socket_(std::move(s)) {
    timeval tv{.tv_sec = 10, .tv_usec = 0};
    ::setsockopt(socket_.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }

  /// False when the peer closed or reset the connection (or an error occurred).
  bool send(std::span<const std::byte> b) {
    boost::system::error_code ec;
    boost::asio::write(socket_, boost::asio::buffer(b.data(), b.size()), ec);
    return !ec;
  }

  struct link_frame {
    tcp_link::frame_type type;
    bytes body;
  };
  /// The next frame, or nullopt on close, reset or timeout.
  std::optional<link_frame> read_frame() {
    std::array<std::byte, tcp_link::head_bytes> head;
    if (read_exact(head)) return std::nullopt;
    const auto h = tcp_link::parse_head(head);
    if (!h || h->length > (1u << 20)) return std::nullopt;
    link_frame f{static_cast<tcp_link::frame_type>(h->type), bytes(h->length - 1)};
    if (read_exact(f.body)) return std::nullopt;
    return f;
  }

  /// True when the other side closes (EOF or reset) before the receive timeout; frames that
  /// arrive first are collected in `seen`.
  bool closed_by_peer(std::vector<link_frame>* seen = nullptr) {
    for (;;) {
      std::array<std::byte, tcp_link::head_bytes> head;
      auto ec = read_exact(head);
      if (ec == boost::asio::error::eof || ec == boost::asio::error::connection_reset) return true;
      if (ec) return false;  // timeout
      const auto h = tcp_link::parse_head(head);
      if (!h) return false;
      link_frame f{static_cast<tcp_link::frame_type>(h->type), bytes(h->length - 1)};
      ec = read_exact(f.body);
      if (ec == boost::asio::error::eof || ec == boost::asio::error::connection_reset) return true;
      if (ec) return false;
      if (seen) seen->push_back(std::move(f));
    }
  }

  /// Client side of the handshake as node `self` towards node `to`; true when ACCEPTed.
  bool handshake(node_id self, node_id to, const job_secret& secret) {
    const auto nonce = make_link_nonce();
    const auto auth = secret.empty() ? tcp_link::auth_mode::none : tcp_link::auth_mode::hmac_sha256;
    if (!send(tcp_link::encode(tcp_link::hello{auth, self, to, nonce}))) return false;
    auto c = read_frame();
    if (!c || c->type != tcp_link::frame_type::challenge) return false;
    const auto ch = tcp_link::parse_challenge(c->body);
    if (!ch) return false;
    link_proof proof{};
    if (!secret.empty())
      proof = make_link_proof(secret, link_role::client, nonce, ch->nonce, self, to);
    if (!send(tcp_link::encode_proof(proof))) return false;
    auto a = read_frame();
    return a && a->type == tcp_link::frame_type::accept;
  }

  /// Server side of the handshake as node `self`; returns the client's node id once ACCEPTed.
  std::optional<node_id> accept_handshake(node_id self, const job_secret& secret) {
    auto f = read_frame();
    if (!f || f->type != tcp_link::frame_type::hello) return std::nullopt;
    const auto h = tcp_link::parse_hello(f->body);
    if (!h || h->to != self) return std::nullopt;
    tcp_link::challenge c{.auth = h->auth, .from = self, .nonce = make_link_nonce()};
    if (!secret.empty())
      c.proof = make_link_proof(secret, link_role::server, h->nonce, c.nonce, h->from, self);
    if (!send(tcp_link::encode(c))) return std::nullopt;
    auto p = read_frame();
    if (!p || p->type != tcp_link::frame_type::proof) return std::nullopt;
    const auto proof = tcp_link::parse_proof(p->body);
    if (!secret.empty() &&
        (!proof || !same_proof(*proof, make_link_proof(secret, link_role::client, h->nonce, c.nonce,
                                                       h->from, self)))) {
      return std::nullopt;
    }
    if (!send(tcp_link::encode_accept())) return std::nullopt;
    return h->from;
  }

  void close() {
    boost::system::error_code ec;
    socket_.close(ec);
  }

 private:
  /// Fills `b`; eof, a reset, or `would_block` after the receive timeout. Asio's own blocking
  /// read polls again without a timeout when the socket's runs out, and would hang the test.
  boost::system::error_code read_exact(std::span<std::byte> b) {
    for (std::size_t got = 0; got < b.size();) {
      const auto n = ::recv(socket_.native_handle(), b.data() + got, b.size() - got, 0);
      if (n == 0) return boost::asio::error::eof;
      if (n < 0 && errno != EINTR) return {errno, boost::system::system_category()};
      if (n > 0) got += static_cast<std::size_t>(n);
    }
    return {};
  }

  boost::asio::io_context io_;
  boost::asio::ip::tcp::socket socket_;
};

/// Bytes of a frame with head (`length`, `type`) and the given body, for frames that lie.
inline std::vector<std::byte> raw_frame(std::uint32_t length, std::uint8_t type,
                                        std::span<const std::byte> body = {}) {
  std::vector<std::byte> out{static_cast<std::byte>(length >> 24),
                             static_cast<std::byte>(length >> 16),
                             static_cast<std::byte>(length >> 8), static_cast<std::byte>(length),
                             static_cast<std::byte>(type)};
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

}  // namespace ferry::test
