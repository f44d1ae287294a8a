#pragma once
/// The transport interface, shaped like RDMA: control frames between nodes, and one-sided bulk
/// writes into memory regions the receiver registered and described in a message, with a
/// completion on both sides (write-with-immediate semantics).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#include "runtime/codec.hpp"
#include "runtime/errc.hpp"
#include "runtime/message.hpp"

namespace ferry {

/// A registered region as a peer sees it: serializable, it travels inside messages.
/// `addr` is what the owner's transport needs to locate the bytes (an offset or a virtual
/// address, per provider); `key` is the protection key a writer must present.
struct region_desc {
  node_id owner = 0;
  std::uint64_t id = 0;
  std::uint64_t addr = 0;
  std::uint64_t key = 0;
  std::uint64_t length = 0;
  friend bool operator==(const region_desc&, const region_desc&) = default;
  FERRY_DEFINE_MAP(owner, id, addr, key, length)
};

/// Immediate data of a bulk write: 32 bits, the least RDMA NICs carry (verbs, EFA). The top
/// byte is a tag that says which consumer on the receiving node the write is for.
using write_imm = std::uint32_t;
inline constexpr write_imm make_imm(std::uint8_t tag, std::uint32_t value) {
  return (write_imm{tag} << 24) | (value & 0xffffffu);
}
inline constexpr std::uint8_t imm_tag(write_imm imm) {
  return static_cast<std::uint8_t>(imm >> 24);
}
inline constexpr std::uint32_t imm_value(write_imm imm) {
  return imm & 0xffffffu;
}
/// An imm value stamped with an epoch's low byte, for writes into memory reused across epochs: the
/// receiver drops a write of an older epoch that lands late instead of taking it for a new one.
inline constexpr std::uint32_t epoch_imm_value(std::uint32_t epoch, std::uint32_t number) {
  return ((epoch & 0xffu) << 16) | (number & 0xffffu);
}
inline constexpr bool imm_of_epoch(std::uint32_t value, std::uint32_t epoch) {
  return (value >> 16) == (epoch & 0xffu);
}
inline constexpr std::uint32_t imm_number(std::uint32_t value) {
  return value & 0xffffu;
}

/// What the receiver of a bulk write learns when the bytes have landed. Only `imm` is
/// guaranteed by every transport; the others are filled where the provider reports them
/// (0 otherwise), so consumers must identify a write by its imm alone.
struct write_notice {
  node_id from = 0;
  std::uint64_t region = 0;  ///< region_desc::id on this node
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  write_imm imm = 0;
};

/// Callbacks a transport makes, always on its event loop's thread.
struct transport_events {
  /// One control frame (without its length prefix) from a peer. The span lives for the call.
  std::function<void(node_id from, std::span<const std::byte> payload)> on_frame;
  /// One message handed over whole (`transport::hands_over_messages`).
  std::function<void(node_id from, decoded_message m)> on_message;
  /// A peer's bulk write landed in one of our regions.
  std::function<void(const write_notice&)> on_write;
  /// A peer was dropped: connection lost, protocol violation, or failed write.
  std::function<void(node_id peer, std::error_code why)> on_peer_lost;
};

/// Thread rules: every member is called on the owning event loop's thread; completions run there.
class transport {
 public:
  using completion = std::function<void(std::error_code)>;
  virtual ~transport() = default;

  /// The scheme ("inproc", "tcp", "cma", "fabric") and this node's reachable address in it.
  virtual std::string_view scheme() const = 0;
  virtual std::string local_address() const = 0;

  /// Begins serving: incoming frames and writes are reported through `events`.
  virtual std::error_code start(transport_events events) = 0;
  /// Closes every link; pending operations complete with `errc::stopped`.
  virtual void close() = 0;

  /// Tells the transport how to reach `peer` (an address from its `local_address`).
  virtual std::error_code add_peer(node_id peer, std::string_view address) = 0;
  /// Forgets `peer`: closes its link; pending operations to it fail.
  virtual void remove_peer(node_id peer) = 0;

  /// Sends one control frame (with its length prefix, as `encode` makes it).
  /// Completion: `void(std::error_code)`, once, after the frame left or failed.
  virtual void async_send(node_id to, frame f, completion done) = 0;

  /// Whether this transport carries messages as objects (`async_hand_over`) instead of frames.
  virtual bool hands_over_messages() const { return false; }
  /// Sends one message as its object, in order with frames; only where `hands_over_messages()`.
  /// `done` may be empty: a simulation's thousands of messages a second need no word back.
  virtual void async_hand_over(node_id /*to*/, handed_message /*m*/, completion /*done*/) {
    throw std::logic_error("transport::async_hand_over: this transport carries frames only");
  }

  /// Registers `memory` for remote writes by peers (and as a local source of writes).
  /// The memory must outlive its registration.
  virtual result<region_desc> register_region(std::span<std::byte> memory) = 0;
  /// Whether this transport reads and writes GPU memory itself (GPUDirect RDMA), so that
  /// `register_device_region` takes it.
  virtual bool reaches_device_memory() const { return false; }
  /// Registers memory of GPU `device` like `register_region`, where `reaches_device_memory()`;
  /// refused, saying why, elsewhere.
  virtual result<region_desc> register_device_region(std::span<std::byte> /*memory*/, int device,
                                                     std::string& why) {
    why = "the " + std::string(scheme()) + " transport cannot reach the memory of GPU " +
          std::to_string(device);
    return fail(errc::invalid_argument);
  }
  /// inproc, tcp and cma: once it returns no peer's write lands in the region, so its owner may
  /// free it (a copy running into it is waited for: milliseconds). fabric closes the region's
  /// memory registration; a write the provider is carrying then is the provider's affair.
  virtual void deregister_region(std::uint64_t region_id) = 0;
  /// Gives a registered region a new key, keeping its id and memory: a write presenting the old
  /// key and checked from then on is refused, and its link stays up (bytes already being copied
  /// may still land: a transport says how much). A receiver that reuses memory across epochs
  /// retires the older epochs' writes so. Unsupported where a refused write costs the link
  /// (libfabric's rxm tears the connection down).
  virtual result<region_desc> rekey_region(std::uint64_t /*region_id*/) {
    return fail(std::make_error_code(std::errc::operation_not_supported));
  }
  /// Whether this transport knows which writes into its regions are under way (not libfabric's
  /// one-sided writes, which its provider may still carry after reporting them failed).
  virtual bool tracks_writes() const { return false; }
  /// Whether a write into region `region_id` is under way: it passed the region's check and has
  /// neither landed nor been refused (nor lost its link). If so, `done` runs on the loop once
  /// none is; else never. After a rekey, the writes the old key let in have then all ended.
  /// Always false where the transport does not track writes.
  virtual bool when_writes_end(std::uint64_t /*region_id*/, std::function<void()> /*done*/) {
    return false;
  }

  /// Writes `local` into `remote` at `offset` on node `remote.owner`, with immediate `imm`.
  /// `local` must lie inside a region registered here and stay untouched until completion.
  /// Completion: `void(std::error_code)`, once, after the bytes landed remotely (or failed);
  /// bounds and key are checked by the receiver before any byte lands.
  virtual void async_write(std::span<const std::byte> local, const region_desc& remote,
                           std::uint64_t offset, write_imm imm, completion done) = 0;
};

}  // namespace ferry
