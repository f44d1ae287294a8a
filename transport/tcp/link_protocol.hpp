#pragma once
/// The tcp link layer: framing of handshake, control, write and ack frames
/// (docs/wire-format.md, "tcp link layer"). Shared by the transport and by tests that speak
/// the protocol over raw sockets.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "runtime/message.hpp"
#include "transport/link_auth.hpp"

namespace ferry::tcp_link {

/// Every link frame: u32 big-endian length of what follows it (type + body), u8 type, body.
/// A WRITE frame's raw payload follows the frame and is not counted in its length.
inline constexpr std::size_t head_bytes = 5;
inline constexpr std::array<std::byte, 4> magic{std::byte{'F'}, std::byte{'R'}, std::byte{'Y'},
                                                std::byte{'L'}};
inline constexpr std::uint16_t link_version = 1;

enum class frame_type : std::uint8_t {
  hello = 1,       ///< client -> server, opens the handshake
  challenge = 2,   ///< server -> client, with the server's proof
  proof = 3,       ///< client -> server
  accept = 4,      ///< server -> client, the link is up
  refuse = 5,      ///< either way during the handshake, then the sender closes
  control = 16,    ///< client -> server: one envelope
  write = 17,      ///< client -> server: header, then the raw payload
  write_ack = 18,  ///< server -> client
  /// Client -> server, same-host mode only: a header and no payload; the server copies the
  /// bytes out of the client's memory (process_vm_readv).
  local_write = 19,
};

enum class auth_mode : std::uint8_t { none = 0, hmac_sha256 = 1 };

inline constexpr std::size_t hello_bytes = 4 + 2 + 1 + 4 + 4 + 32;
inline constexpr std::size_t challenge_bytes = 4 + 2 + 1 + 4 + 32 + 32;
inline constexpr std::size_t proof_bytes = 32;
inline constexpr std::size_t refuse_bytes = 2;
inline constexpr std::size_t write_header_bytes = 8 * 4 + 4 + 8;
inline constexpr std::size_t write_ack_bytes = 8 + 2;
inline constexpr std::size_t local_write_bytes = write_header_bytes + 4 + 8 + 8;

struct hello {
  auth_mode auth = auth_mode::none;
  node_id from = 0;  ///< the client's node id, proven by its proof
  node_id to = 0;    ///< the node the client means to reach
  link_nonce nonce{};
};

struct challenge {
  auth_mode auth = auth_mode::none;
  node_id from = 0;  ///< the server's node id
  link_nonce nonce{};
  link_proof proof{};  ///< all zero when auth is none
};

struct write_header {
  std::uint64_t region = 0;
  std::uint64_t key = 0;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;  ///< payload bytes that follow the frame
  std::uint32_t imm = 0;
  std::uint64_t id = 0;  ///< chosen by the writer, echoed in the ack
};

/// A write whose bytes the server copies from the writer's memory (same host, `tcp_options::
/// same_host_copy`). `host` names the writer's host and pid namespace, so that a server elsewhere
/// refuses it rather than read whichever local process has that pid.
struct local_write_header {
  write_header write;        ///< `write.length` bytes at `source` in process `pid`
  std::uint32_t pid = 0;     ///< the writer's process id
  std::uint64_t source = 0;  ///< the virtual address of the bytes in the writer's memory
  std::uint64_t host = 0;    ///< `same_host_tag()` of the writer
};

struct write_ack {
  std::uint64_t id = 0;
  std::uint16_t status = 0;  ///< 0, or the transport_errc value of the refusal
};

/// The 5-byte head of a frame whose type + body take `1 + body_bytes` bytes.
std::array<std::byte, head_bytes> make_head(frame_type type, std::size_t body_bytes);
/// Length (of type + body) and type of a head; nullopt when the length is 0.
struct head_fields {
  std::uint32_t length;
  std::uint8_t type;
};
std::optional<head_fields> parse_head(std::span<const std::byte, head_bytes> head);

/// Whole frames (head + body).
std::vector<std::byte> encode(const hello& h);
std::vector<std::byte> encode(const challenge& c);
std::vector<std::byte> encode_proof(const link_proof& p);
std::vector<std::byte> encode_accept();
std::vector<std::byte> encode_refuse(std::uint16_t reason);
std::vector<std::byte> encode(const write_header& w);
std::vector<std::byte> encode(const write_ack& a);
std::vector<std::byte> encode(const local_write_header& w);

/// Bodies (without head); nullopt when the size or the magic/version is wrong.
std::optional<hello> parse_hello(std::span<const std::byte> body);
std::optional<challenge> parse_challenge(std::span<const std::byte> body);
std::optional<link_proof> parse_proof(std::span<const std::byte> body);
std::optional<std::uint16_t> parse_refuse(std::span<const std::byte> body);
std::optional<write_header> parse_write(std::span<const std::byte> body);
std::optional<write_ack> parse_write_ack(std::span<const std::byte> body);
std::optional<local_write_header> parse_local_write(std::span<const std::byte> body);

}  // namespace ferry::tcp_link
