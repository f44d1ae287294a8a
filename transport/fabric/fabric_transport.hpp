#pragma once
/// Transport over libfabric: one RDM endpoint with FI_MSG for control frames and FI_RMA
/// write-with-data for bulk writes. The same code runs on `tcp;ofi_rxm` and `shm` here and on
/// verbs / efa / cxi on clusters; no libfabric type appears in this header.
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/event_loop.hpp"
#include "runtime/transport.hpp"
#include "transport/link_auth.hpp"

namespace ferry {

/// How a fabric transport opens its endpoint.
struct fabric_options {
  /// The job secret: before a node accepts any frame or notice from another, the two prove they
  /// hold it (a challenge-response handshake, as tcp's), and every message of the link then
  /// carries a sequence number and an HMAC under a key of that handshake. Writes with remote CQ
  /// data (rxm, verbs) carry no tag: their memory keys reach only peers that proved the secret.
  job_secret secret;
  /// Without a secret, `start` fails unless this is set (tests, benchmarks).
  bool allow_unauthenticated = false;
  /// libfabric provider name ("tcp;ofi_rxm", "shm", "verbs;ofi_rxm", ...). Empty: the first
  /// RDM provider with RMA and remote CQ data that fi_getinfo offers for `node` (on these
  /// machines `tcp;ofi_rxm`, which works between processes and hosts; shm is same-host only).
  std::string provider;
  /// Local address to bind. Loopback by default; ignored for shm, which binds no address.
  std::string node = "127.0.0.1";
  /// Pre-posted receive buffers for control frames.
  std::size_t rx_buffers = 16;
  /// Largest control frame (length prefix included) sent or accepted; larger ones are refused.
  std::size_t max_frame = 1u << 20;
  /// Largest single RMA write issued; larger writes are split. 0: the provider's max_msg_size.
  std::size_t max_write_piece = 0;
  /// A peer with work outstanding that neither takes nor completes any of it for this long is
  /// given up on: its operations fail and it is reported lost. A dead shm peer otherwise refuses
  /// (-FI_EAGAIN) forever, and its writes never complete.
  std::chrono::milliseconds stall_timeout{10000};
  /// Watch each peer's process over a tcp connection on `node` (transport/peer_watch.hpp), so that
  /// a death is seen at once; the address then carries the watch's host:port after an '@'.
  bool watch_peers = true;
};

/// Counters of what the transport refused or saw fail; owning loop only.
struct fabric_stats {
  std::uint64_t frames_received = 0;
  std::uint64_t frames_rejected = 0;  ///< truncated, too short, or from an unknown sender
  std::uint64_t writes_received = 0;
  std::uint64_t writes_refused = 0;  ///< refused by the local checks or by the peer's provider
  std::uint64_t eagain_retries = 0;  ///< operations queued because the provider was busy
  std::uint64_t peers_stalled = 0;   ///< peers given up on after `stall_timeout`
  /// Messages refused because their sender proved no secret, or their tag or sequence number is
  /// wrong (a forged sender, a replay, a peer without a secret).
  std::uint64_t unauthenticated = 0;
  std::uint64_t handshakes_refused = 0;  ///< handshakes whose proof did not hold, or over the cap
};

/// Create with `make`; every member runs on the owning loop's thread, completions run there.
class fabric_transport final : public transport,
                               public std::enable_shared_from_this<fabric_transport> {
 public:
  /// Opens fabric, domain, address vector, completion queue and endpoint for `self`.
  static result<std::shared_ptr<fabric_transport>> make(event_loop& loop, node_id self,
                                                        fabric_options options = {});
  ~fabric_transport() override;

  std::string_view scheme() const override { return "fabric"; }
  /// The endpoint's fi_getname blob, hex-encoded.
  std::string local_address() const override;
  std::error_code start(transport_events events) override;
  void close() override;
  std::error_code add_peer(node_id peer, std::string_view address) override;
  void remove_peer(node_id peer) override;
  void async_send(node_id to, frame f, completion done) override;
  result<region_desc> register_region(std::span<std::byte> memory) override;
  /// Refused, naming the provider: `reaches_device_memory()` stays false (docs/architecture.md).
  result<region_desc> register_device_region(std::span<std::byte> memory, int device,
                                             std::string& why) override;
  void deregister_region(std::uint64_t region_id) override;
  void async_write(std::span<const std::byte> local, const region_desc& remote,
                   std::uint64_t offset, write_imm imm, completion done) override;

  /// The provider actually opened, e.g. "tcp;ofi_rxm".
  std::string provider() const;
  /// How progress is driven when idle: "wait-fd" (the CQ's fd in the loop's epoll) or "timer".
  std::string_view progress_mode() const;
  const fabric_stats& stats() const;

  struct impl;

 private:
  explicit fabric_transport(std::shared_ptr<impl> state);
  std::shared_ptr<impl> impl_;  ///< shared so loop handlers can hold it weakly
};

/// libfabric 1.17's shm provider keeps each endpoint's queues in a 16 MiB file of /dev/shm named
/// "<pid>:<uid>:<endpoint>", and removes it when the endpoint closes or the process dies of a
/// signal it can catch. A process SIGKILLed (by a launcher, by the OOM killer) leaves its files
/// behind for good. Removes those of `pid`, which must be dead: call it before reaping it, while
/// no other process can hold its pid. Returns how many it removed.
std::size_t remove_shm_regions_of(pid_t pid);

}  // namespace ferry
