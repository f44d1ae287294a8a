#pragma once
/// The libfabric objects of one RDM endpoint (fabric, domain, address vector, completion queue and
/// endpoint), what the provider said of itself, and the contexts of its operations.
#include <rdma/fabric.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "runtime/errc.hpp"
#include "transport/fabric/fabric_transport.hpp"

namespace ferry::fabric_link {

enum class op_kind : std::uint8_t { recv, send, write, handshake };

/// One provider operation. The provider owns the leading fi_context2 while the operation is in
/// flight (FI_CONTEXT/FI_CONTEXT2 modes), so ops live in a pool, never on the stack.
struct op {
  fi_context2 ctx;
  op_kind kind;
  std::uint64_t owner;  ///< rx slot, send id, write id or handshake id
  std::uint64_t bytes;  ///< length of this piece (writes)
};

/// Operations' contexts, at stable addresses.
class op_pool {
 public:
  op* take(op_kind kind, std::uint64_t owner, std::uint64_t bytes = 0);
  void give(op* o) { free_.push_back(o); }

 private:
  std::deque<op> store_;
  std::vector<op*> free_;
};

/// What the caller of one operation learns of a provider error.
std::error_code map_op_error(int err);
/// The peer is gone (its link dropped), as opposed to a refusal of one operation.
bool is_link_error(std::error_code ec);
std::string fi_error_text(int rc);

/// The fi_getinfo hints ferry opens an endpoint with (the caller frees them), and the node to ask
/// for (a pointer into `options`, or null for shm): RDM, messages and RMA, provider-chosen keys,
/// frames in order.
fi_info* endpoint_hints(const fabric_options& options);
const char* endpoint_node(const fabric_options& options);

/// Owning loop only. Closing it fails nothing: its owner fails what it had in flight.
struct endpoint {
  /// Opens the first provider that `options` names (or any) with RDM, RMA and 4 bytes of remote
  /// CQ data; the CQ with a wait fd where the provider gives one.
  static result<std::unique_ptr<endpoint>> open(const fabric_options& options);
  endpoint() = default;
  endpoint(const endpoint&) = delete;
  endpoint& operator=(const endpoint&) = delete;
  ~endpoint() { close(); }

  /// Registers [data, data+n) honouring the provider's mr_mode bits.
  std::error_code register_memory(void* data, std::size_t n, std::uint64_t access, fid_mr*& out,
                                  std::uint64_t requested_key = 0);
  /// The address vector entry of the endpoint named `name`; nothing when the provider refuses it.
  std::optional<fi_addr_t> insert(std::span<const std::byte> name);
  void remove(fi_addr_t addr);
  /// The CQ's wait fd may be slept on: nothing moves until it fires (fi_trywait).
  bool may_sleep();
  /// The endpoint first, so that nothing it held completes any more; then the rest.
  void close_endpoint();
  void close();

  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  fid_ep* ep = nullptr;
  int wait_fd = -1;  ///< the CQ's, or -1 (progress by timer alone)
  std::string provider_name;
  std::uint64_t mr_mode = 0;
  std::uint64_t max_piece = 0;   ///< largest single write
  std::size_t inject_limit = 0;  ///< the provider's inject_size
  /// shm completes an operation that needs its target's response (a send above inject_size, a
  /// write with CQ data) through one in-order queue per endpoint: one to a dead peer blocks the
  /// completion of every later one, to any peer. On shm ferry therefore issues only operations
  /// that complete at once: injected messages (a larger frame in fragments) and writes without
  /// CQ data (copied in the call), each write followed by an injected notice.
  bool inject_only = false;
  std::vector<std::byte> name;  ///< our endpoint's fi_getname blob

 private:
  std::error_code choose_provider(const fabric_options& options);
  std::error_code open_objects();
  std::error_code open_cq();
};

}  // namespace ferry::fabric_link
