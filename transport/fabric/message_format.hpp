#pragma once
/// The fabric link layer's messages (docs/wire-format.md, "The fabric link layer"): how a control
/// message, a fragment, a write notice and a handshake step are laid out in one provider message.
/// No libfabric type here: the format is bytes, and tests read it without a provider.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "runtime/codec.hpp"
#include "runtime/errc.hpp"
#include "runtime/transport.hpp"
#include "transport/link_auth.hpp"

namespace ferry::fabric_link {

/// Each message is [sender node id, BE32][payload][trailer, BE32]; the trailer holds the payload's
/// length and, in its top two bits, what the message is.
inline constexpr std::size_t trailer_bytes = 4;
inline constexpr std::size_t message_overhead = frame_prefix_bytes + trailer_bytes;
inline constexpr std::uint32_t length_mask = (1u << 30) - 1;

enum class message_kind : std::uint32_t {
  frame = 0,      ///< a whole frame, or the last piece of one
  fragment = 1,   ///< a piece of a frame; more follow
  notice = 2,     ///< a write landed: [target address, BE64][length, BE64][immediate, BE32]
  handshake = 3,  ///< a step of the link handshake (`handshake_step`); never sealed
};

/// With a job secret every other message is sealed: [sequence, BE64][tag, 16] before the trailer.
inline constexpr std::size_t seal_bytes = 8 + std::tuple_size_v<message_tag>;
inline constexpr std::size_t notice_bytes = 8 + 8 + 4;

std::uint32_t make_trailer(message_kind kind, std::size_t payload);
message_kind kind_of(std::uint32_t trailer);

void put_be32(std::byte* p, std::uint32_t v);
std::uint32_t get_be32(const std::byte* p);
void put_be64(std::byte* p, std::uint64_t v);
std::uint64_t get_be64(const std::byte* p);

/// Where a write landed, as an `inject_only` writer tells its target.
struct notice {
  std::uint64_t address = 0;  ///< in the target's memory (FI_MR_VIRT_ADDR)
  std::uint64_t length = 0;
  write_imm imm = 0;
};
/// Writes the notice's `notice_bytes` at `at`.
void encode_notice(std::byte* at, const notice& n);
std::optional<notice> parse_notice(std::span<const std::byte> payload);

/// The link handshake, one direction of a pair of nodes (the client sends, the server receives):
///   hello     [client nonce][client's endpoint name]      client -> server
///   challenge [client nonce][server nonce][server proof]  server -> client
///   proof     [server nonce][client proof]                client -> server
/// each after a byte naming the step.
enum class handshake_step : std::uint8_t { hello = 1, challenge = 2, proof = 3 };
/// The longest endpoint name a hello may carry.
inline constexpr std::size_t max_name_bytes = 256;

struct handshake_message {
  handshake_step step = handshake_step::hello;
  link_nonce client_nonce{};        ///< hello, challenge
  link_nonce server_nonce{};        ///< challenge, proof
  link_proof proof{};               ///< challenge: the server's; proof: the client's
  std::span<const std::byte> name;  ///< hello: where the client's endpoint is
};
std::vector<std::byte> encode_hello(const link_nonce& client_nonce,
                                    std::span<const std::byte> name);
std::vector<std::byte> encode_challenge(const link_nonce& client_nonce,
                                        const link_nonce& server_nonce,
                                        const link_proof& server_proof);
std::vector<std::byte> encode_proof(const link_nonce& server_nonce, const link_proof& client_proof);
/// Nothing when the step is unknown or the size is not the step's.
std::optional<handshake_message> parse_handshake(std::span<const std::byte> body);

/// An endpoint name as it travels in an address: lower-case hex.
std::string hex_encode(std::span<const std::byte> bytes);
/// Refuses (bad_address) what is empty, odd, over 1 KiB or not hex.
result<std::vector<std::byte>> hex_decode(std::string_view text);

}  // namespace ferry::fabric_link
