#include "transport/fabric/fabric_transport.hpp"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/fiber/operations.hpp>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "runtime/log.hpp"
#include "transport/errc.hpp"
#include "transport/peer_watch.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;

/// How long progress stays continuous after the last completion, notice, frame or wake-up by the
/// wait fd. rxm and shm move bytes only while someone polls, the target of a write included, so
/// a target polls on while writes stream in: each keeps it within this window of the last.
constexpr auto active_window = std::chrono::steady_clock::duration(2ms);
/// First poll period when idle without a usable wait fd; it doubles up to `idle_interval`.
constexpr auto first_idle_poll = std::chrono::steady_clock::duration(20us);
/// Longest pause between polls when idle and the provider gives no wait fd.
constexpr auto idle_interval = std::chrono::steady_clock::duration(2ms);
/// How often peers with work outstanding are checked against `stall_timeout`.
constexpr auto stall_check_period = std::chrono::steady_clock::duration(250ms);
/// Completions handled per turn, so one busy transport cannot starve the loop.
constexpr int drain_budget = 256;
/// Each control message is [sender node id, BE32][payload][trailer, BE32]; the trailer holds the
/// payload's length and, in its top two bits, what the message is.
constexpr std::size_t trailer_bytes = 4;
constexpr std::size_t message_overhead = frame_prefix_bytes + trailer_bytes;
enum class message_kind : std::uint32_t {
  frame = 0,      ///< a whole frame, or the last piece of one
  fragment = 1,   ///< a piece of a frame; more follow
  notice = 2,     ///< a write landed: [target address, BE64][length, BE64][immediate, BE32]
  handshake = 3,  ///< a step of the link handshake (`handshake_step`); never sealed
};
/// With a job secret every other message is sealed: [sequence, BE64][tag, 16] before the trailer.
constexpr std::size_t seal_bytes = 8 + std::tuple_size_v<message_tag>;
/// The link handshake, one direction of a pair of nodes (the client sends, the server receives):
///   hello     [client nonce][client's endpoint name]      client -> server
///   challenge [client nonce][server nonce][server proof]  server -> client
///   proof     [server nonce][client proof]                client -> server
/// Proofs and the link's message key are `make_link_proof` of the job secret over both nonces and
/// both node ids, as on tcp links.
enum class handshake_step : std::uint8_t { hello = 1, challenge = 2, proof = 3 };
constexpr std::size_t nonce_bytes = std::tuple_size_v<link_nonce>;
constexpr std::size_t proof_bytes = std::tuple_size_v<link_proof>;
/// Servers answer at most this many handshakes at once; more hellos are refused.
constexpr std::size_t max_pending_handshakes = 64;
constexpr std::uint32_t length_mask = (1u << 30) - 1;
constexpr std::size_t notice_bytes = 8 + 8 + 4;
std::uint32_t make_trailer(message_kind kind, std::size_t payload) {
  return static_cast<std::uint32_t>(kind) << 30 | static_cast<std::uint32_t>(payload);
}

enum class op_kind : std::uint8_t { recv, send, write, handshake };

/// One provider operation. The provider owns the leading fi_context2 while the operation is
/// in flight (FI_CONTEXT/FI_CONTEXT2 modes), so ops live in a pool, never on the stack.
struct op {
  fi_context2 ctx;
  op_kind kind;
  std::uint64_t owner;  ///< rx slot, send id or write id
  std::uint64_t bytes;  ///< length of this piece (writes)
};
static_assert(std::is_standard_layout_v<op>);

std::string hex_encode(const std::byte* data, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = std::to_integer<unsigned>(data[i]);
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

result<std::vector<std::byte>> hex_decode(std::string_view s) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (s.empty() || s.size() % 2 != 0 || s.size() > 1024) return fail(transport_errc::bad_address);
  std::vector<std::byte> out(s.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = nibble(s[2 * i]);
    const int lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return fail(transport_errc::bad_address);
    out[i] = static_cast<std::byte>(hi << 4 | lo);
  }
  return out;
}

void put_be32(std::byte* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (24 - 8 * i));
}
std::uint32_t get_be32(const std::byte* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = v << 8 | std::to_integer<std::uint32_t>(p[i]);
  return v;
}
void put_be64(std::byte* p, std::uint64_t v) {
  put_be32(p, static_cast<std::uint32_t>(v >> 32));
  put_be32(p + 4, static_cast<std::uint32_t>(v));
}
std::uint64_t get_be64(const std::byte* p) {
  return std::uint64_t{get_be32(p)} << 32 | get_be32(p + 4);
}

/// Maps a provider error of one operation to what the caller learns.
std::error_code map_op_error(int err) {
  switch (err) {
    case FI_EACCES:
    case FI_EPERM:
    case FI_EKEYREJECTED:
    case FI_EINVAL:
    case FI_EFAULT:
    case FI_EOPNOTSUPP:
      // One-sided writes learn only that the peer's provider refused the key or the range.
      return transport_errc::key_mismatch;
    case FI_ETRUNC:
    case FI_EMSGSIZE:
      return transport_errc::limit_exceeded;
    // We never fi_cancel and fail our own ops on close, so a cancel is the provider dropping
    // the link (tcp;ofi_rxm does so when the target refuses an RMA key or range).
    case FI_ECANCELED:
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_ENOTCONN:
    case FI_EHOSTUNREACH:
    case FI_ENETUNREACH:
    case FI_ETIMEDOUT:
    case FI_EIO:
    case FI_ESHUTDOWN:
    case ESRCH:  // shm: the target process is gone (process_vm_writev)
      return transport_errc::connection_lost;
    default:
      return transport_errc::provider_error;
  }
}

bool is_link_error(std::error_code ec) {
  return ec == transport_errc::connection_lost;
}

std::string fi_error_text(int rc) {
  return fi_strerror(rc < 0 ? -rc : rc);
}

}  // namespace

struct fabric_transport::impl : std::enable_shared_from_this<impl> {
  struct region {
    std::uint64_t id = 0;
    std::span<std::byte> memory;
    fid_mr* mr = nullptr;
    void* desc = nullptr;
    std::uint64_t key = 0;
  };
  struct send_state {
    frame bytes;
    completion done;
    node_id peer = 0;
    fi_addr_t addr = FI_ADDR_UNSPEC;
    fid_mr* mr = nullptr;  ///< only under FI_MR_LOCAL
    std::size_t injected = 0;  ///< payload bytes injected so far (`inject_only`)
    bool issued = false;   ///< the provider holds it
    bool holds_order = false;  ///< later traffic to the peer waits for its completion
    bool orphaned = false;  ///< its caller was told it failed; the provider still holds it
  };
  struct write_state {
    completion done;
    node_id peer = 0;
    fi_addr_t addr = FI_ADDR_UNSPEC;
    const std::byte* src = nullptr;
    std::uint64_t length = 0;
    void* desc = nullptr;
    std::uint64_t remote_addr = 0;
    std::uint64_t key = 0;
    write_imm imm = 0;
    std::uint64_t body_end = 0;  ///< bytes sent without data before the final piece
    std::uint64_t issued = 0;    ///< body bytes issued
    std::uint64_t landed = 0;    ///< body bytes completed
    std::uint32_t in_flight = 0;
    bool final_issued = false;
    bool queued = false;
    bool orphaned = false;  ///< its caller was told it failed; pieces may still be in flight
    std::error_code error;
  };
  /// Our side of a link to a peer we send to.
  struct client_session {
    enum class step { hello_sent, proving, ready } at = step::hello_sent;
    link_nonce nonce{};
    link_proof key{};  ///< seals our messages, from `proving` on
    std::uint64_t next_seq = 0;
  };
  /// Our side of a link from a peer that sends to us, by the node id it claims.
  struct server_session {
    std::optional<link_proof> key;  ///< once the peer proved the secret
    std::uint64_t next_seq = 0;     ///< lowest sequence number still accepted
    std::optional<std::pair<link_nonce, link_nonce>> pending;  ///< its nonce and ours, mid-handshake
    std::optional<fi_addr_t> temporary;  ///< address entry made to answer a hello
  };
  /// A handshake message on its way. It never counts as a peer's traffic, so a stranger's hello
  /// cannot stall or fail a member's link.
  struct handshake_out {
    std::vector<std::byte> bytes;
    fi_addr_t addr = FI_ADDR_UNSPEC;
    node_id peer = 0;
    bool readies = false;  ///< our proof: the link is ready once the provider took it
    std::chrono::steady_clock::time_point since{};
  };
  /// A send or write waiting for the provider to accept it (-FI_EAGAIN).
  struct blocked {
    op_kind kind;
    std::uint64_t id;
  };
  /// What is outstanding towards one peer. Operations the provider refused wait per peer, in
  /// order: a peer that stopped taking them (a dead shm process) holds up only its own.
  struct peer_traffic {
    std::deque<blocked> waiting;
    std::uint32_t in_flight = 0;  ///< accepted by the provider, not yet completed
    std::uint32_t order_holders = 0;  ///< sends in flight that later traffic must not overtake
    std::chrono::steady_clock::time_point last_progress{};
    bool idle() const { return waiting.empty() && in_flight == 0; }
  };

  event_loop& loop;
  node_id self;
  fabric_options options;
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  fid_ep* ep = nullptr;
  std::uint64_t mr_mode = 0;
  std::uint64_t max_piece = 0;
  std::string name_hex;
  std::vector<std::byte> name;  ///< our endpoint's fi_getname blob
  /// Sees a peer's process end at once: the endpoint has no connection whose end would say so.
  std::shared_ptr<peer_watch> watch;
  std::string provider_name;
  /// shm completes an operation that needs its target's response (a send above inject_size, a
  /// write with CQ data) through one in-order queue per endpoint: one to a dead peer blocks the
  /// completion of every later one, to any peer. On shm ferry therefore issues only operations
  /// that complete at once: injected messages (a larger frame in fragments) and writes without
  /// CQ data (copied in the call), each write followed by an injected notice.
  bool inject_only = false;
  std::size_t inject_limit = 0;  ///< the provider's inject_size

  asio::steady_timer timer;
  std::chrono::steady_clock::time_point timer_deadline{};
  bool timer_armed = false;
  std::optional<asio::posix::stream_descriptor> wait_fd;
  bool fd_armed = false;
  unsigned idle_streak = 0;
  bool pumping = false;      ///< a pump fiber is alive
  bool kick_posted = false;  ///< the pump's kick is queued and has not run yet
  std::chrono::steady_clock::time_point active_until{};

  transport_events events;
  bool running = false;
  bool closed = false;
  fabric_stats counters;

  std::unordered_map<node_id, fi_addr_t> peers;
  std::unordered_map<node_id, std::vector<std::byte>> peer_names;  ///< fi_getname blobs
  std::map<std::uint64_t, region> regions;                         // by id
  std::map<const std::byte*, std::uint64_t> by_base;               // region base -> id
  /// A frame arriving in fragments; one over the frame limit is dropped up to its last piece.
  struct partial_frame {
    std::vector<std::byte> bytes;
    bool dropped = false;
  };
  std::unordered_map<node_id, partial_frame> partial_frames;
  std::uint64_t next_region = 1;
  std::mt19937_64 keys{std::random_device{}()};

  std::unordered_map<node_id, client_session> clients;
  std::unordered_map<node_id, server_session> servers;
  std::unordered_map<std::uint64_t, handshake_out> handshakes;  ///< in flight or waiting, by op id
  std::deque<std::uint64_t> handshakes_waiting;

  std::unique_ptr<std::byte[]> rx_slab;
  fid_mr* rx_mr = nullptr;
  std::vector<op*> rx_ops;

  std::deque<op> op_store;  // stable addresses
  std::vector<op*> free_ops;
  std::unordered_map<std::uint64_t, send_state> sends;
  std::unordered_map<std::uint64_t, write_state> writes;
  std::uint64_t next_op_id = 1;
  std::map<node_id, peer_traffic> traffic;  // a map: retrying may touch entries while iterating
  std::deque<std::uint64_t> rx_waiting;      ///< receive slots the provider refused
  std::size_t waiting_ops = 0;               ///< in `rx_waiting` and every peer's `waiting`
  std::size_t tx_in_flight = 0;
  std::size_t abandoned_in_flight = 0;  ///< of `tx_in_flight`: ops of peers given up on
  std::chrono::steady_clock::time_point next_stall_check{};

  impl(event_loop& l, node_id s, fabric_options o)
      : loop(l), self(s), options(std::move(o)), timer(l.io()) {}
  ~impl() { shutdown(); }

  // ---- setup ---------------------------------------------------------------------------------

  std::error_code open() {
    fi_info* hints = fi_allocinfo();
    if (!hints) return transport_errc::provider_error;
    // Remote CQ data is no capability bit in libfabric 1.17: domain_attr->cq_data_size says it.
    hints->caps = FI_MSG | FI_RMA;
    hints->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
    hints->ep_attr->type = FI_EP_RDM;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    // Frames to one peer must arrive in the order sent. (rxm still completes a large frame after
    // smaller ones sent later: `send_state::holds_order` keeps that from happening.)
    hints->tx_attr->msg_order = FI_ORDER_SAS;
    hints->rx_attr->msg_order = FI_ORDER_SAS;
    if (!options.provider.empty()) hints->fabric_attr->prov_name = strdup(options.provider.c_str());
    const bool is_shm = options.provider == "shm";
    const char* node = (is_shm || options.node.empty()) ? nullptr : options.node.c_str();
    fi_info* found = nullptr;
    int rc = fi_getinfo(FI_VERSION(1, 17), node, nullptr, node ? FI_SOURCE : 0, hints, &found);
    fi_freeinfo(hints);
    if (rc != 0 || !found) {
      log::warn("fabric: no provider '{}' with RDM+RMA+remote CQ data: {}", options.provider,
                fi_error_text(rc));
      return transport_errc::peer_unreachable;
    }
    for (fi_info* i = found; i; i = i->next) {
      if (i->domain_attr->cq_data_size >= sizeof(write_imm)) {
        info = fi_dupinfo(i);
        break;
      }
    }
    fi_freeinfo(found);
    if (!info) {
      log::warn("fabric: provider '{}' carries fewer than 4 bytes of CQ data", options.provider);
      return transport_errc::provider_error;
    }
    provider_name = info->fabric_attr->prov_name ? info->fabric_attr->prov_name : "";
    mr_mode = info->domain_attr->mr_mode;
    max_piece = info->ep_attr->max_msg_size;
    if (options.max_write_piece != 0)
      max_piece = std::min<std::uint64_t>(max_piece, options.max_write_piece);
    if (max_piece == 0) max_piece = 1u << 30;
    inject_limit = info->tx_attr->inject_size;
    inject_only = provider_name == "shm" && inject_limit > message_overhead + notice_bytes;

    if ((rc = fi_fabric(info->fabric_attr, &fabric, nullptr)))
      return provider_failed("fi_fabric", rc);
    if ((rc = fi_domain(fabric, info, &domain, nullptr))) return provider_failed("fi_domain", rc);

    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_DATA;
    cq_attr.wait_obj = FI_WAIT_FD;
    cq_attr.size = 0;
    rc = fi_cq_open(domain, &cq_attr, &cq, nullptr);
    if (rc == 0) {
      int fd = -1;
      if (fi_control(&cq->fid, FI_GETWAIT, &fd) == 0 && fd >= 0) {
        wait_fd.emplace(loop.io(), fd);
      } else {
        fi_close(&cq->fid);
        cq = nullptr;
      }
    }
    if (!cq) {
      cq_attr.wait_obj = FI_WAIT_NONE;
      if ((rc = fi_cq_open(domain, &cq_attr, &cq, nullptr)))
        return provider_failed("fi_cq_open", rc);
    }

    fi_av_attr av_attr{};
    av_attr.type = info->domain_attr->av_type;
    if ((rc = fi_av_open(domain, &av_attr, &av, nullptr))) return provider_failed("fi_av_open", rc);
    if ((rc = fi_endpoint(domain, info, &ep, nullptr))) return provider_failed("fi_endpoint", rc);
    if ((rc = fi_ep_bind(ep, &av->fid, 0))) return provider_failed("fi_ep_bind(av)", rc);
    if ((rc = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)))
      return provider_failed("fi_ep_bind(cq)", rc);
    if ((rc = fi_enable(ep))) return provider_failed("fi_enable", rc);

    name.resize(256);
    std::size_t len = name.size();
    if ((rc = fi_getname(&ep->fid, name.data(), &len))) return provider_failed("fi_getname", rc);
    name.resize(len);
    name_hex = hex_encode(name.data(), len);

    const std::size_t slot = rx_slot();
    rx_slab = std::make_unique<std::byte[]>(slot * options.rx_buffers);
    if (mr_mode & FI_MR_LOCAL) {
      if (auto ec = register_memory(rx_slab.get(), slot * options.rx_buffers, FI_RECV, rx_mr))
        return ec;
    }
    for (std::size_t i = 0; i < options.rx_buffers; ++i) {
      op* o = take_op(op_kind::recv, i);
      rx_ops.push_back(o);
    }
    log::debug("fabric: node {} opened provider {} (mr_mode {:#x}, max piece {}, progress {}{})", self,
               provider_name, mr_mode, max_piece, wait_fd ? "wait-fd" : "timer",
               inject_only ? ", inject only" : "");
    return {};
  }

  /// A receive buffer holds the largest frame plus its length trailer.
  std::size_t rx_slot() const { return options.max_frame + trailer_bytes; }

  std::error_code provider_failed(const char* what, int rc) {
    log::warn("fabric: {} failed: {}", what, fi_error_text(rc));
    return transport_errc::provider_error;
  }

  /// Registers [data, data+n) honouring the provider's mr_mode bits.
  std::error_code register_memory(void* data, std::size_t n, std::uint64_t access, fid_mr*& out,
                                  std::uint64_t requested_key = 0) {
    int rc = fi_mr_reg(domain, data, n, access, 0, requested_key, 0, &out, nullptr);
    if (rc) return provider_failed("fi_mr_reg", rc);
    if (mr_mode & FI_MR_ENDPOINT) {
      if ((rc = fi_mr_bind(out, &ep->fid, 0)) || (rc = fi_mr_enable(out))) {
        fi_close(&out->fid);
        out = nullptr;
        return provider_failed("fi_mr_bind/enable", rc);
      }
    }
    return {};
  }

  /// Opens the peer watch beside the endpoint; without one (no tcp on `options.node`), deaths
  /// are found by the heartbeat's timeout and the stall detector.
  void open_watch() {
    if (!options.watch_peers) return;
    watch = peer_watch::make(loop.io(), self, options.secret, [weak = weak_from_this()](node_id peer) {
      if (auto self_ = weak.lock()) self_->peer_ended(peer);
    });
    const std::string host = provider_name == "shm" ? "127.0.0.1" : options.node;
    if (auto ec = watch->listen(host)) {
      log::warn("fabric: node {} cannot watch its peers over tcp on '{}' ({}): a death is found at the heartbeat's "
                "timeout", self, host, ec.message());
      watch.reset();
    }
  }

  /// The watch saw `peer`'s process end: it is lost, as a tcp link's end says.
  void peer_ended(node_id peer) {
    if (closed || !peers.contains(peer)) return;
    log::debug("fabric: node {}: the process of node {} ended", self, peer);
    abandon(peer, transport_errc::connection_lost);
    report_peer_lost(peer, transport_errc::connection_lost);
  }

  void shutdown() {
    if (closed) return;
    closed = true;
    running = false;
    if (watch) watch->close();
    timer.cancel();
    if (wait_fd) {
      boost::system::error_code ignored;
      wait_fd->cancel(ignored);
      wait_fd->release();  // the fd belongs to the CQ
      wait_fd.reset();
    }
    if (ep) fi_close(&ep->fid);
    ep = nullptr;
    // The endpoint is gone, so nothing in flight completes any more: fail it all, once.
    for (auto& [id, s] : sends) {
      if (s.mr) fi_close(&s.mr->fid);
      if (!s.orphaned && s.done) post_done(std::move(s.done), errc::stopped);
    }
    sends.clear();
    for (auto& [id, w] : writes) {
      if (!w.orphaned && w.done) post_done(std::move(w.done), errc::stopped);
    }
    writes.clear();
    traffic.clear();
    rx_waiting.clear();
    waiting_ops = 0;
    handshakes.clear();
    handshakes_waiting.clear();
    for (auto& [id, r] : regions)
      if (r.mr) fi_close(&r.mr->fid);
    regions.clear();
    by_base.clear();
    if (rx_mr) fi_close(&rx_mr->fid);
    rx_mr = nullptr;
    if (cq) fi_close(&cq->fid);
    if (av) fi_close(&av->fid);
    if (domain) fi_close(&domain->fid);
    if (fabric) fi_close(&fabric->fid);
    cq = nullptr;
    av = nullptr;
    domain = nullptr;
    fabric = nullptr;
    if (info) fi_freeinfo(info);
    info = nullptr;
  }

  // ---- op pool and completions ---------------------------------------------------------------

  op* take_op(op_kind kind, std::uint64_t owner, std::uint64_t bytes = 0) {
    op* o;
    if (free_ops.empty()) {
      o = &op_store.emplace_back();
    } else {
      o = free_ops.back();
      free_ops.pop_back();
    }
    std::memset(&o->ctx, 0, sizeof(o->ctx));
    o->kind = kind;
    o->owner = owner;
    o->bytes = bytes;
    return o;
  }
  void give_op(op* o) { free_ops.push_back(o); }

  void post_done(completion done, std::error_code ec) {
    if (!done) return;
    loop.post([done = std::move(done), ec] { done(ec); });
  }

  void report_peer_lost(node_id peer, std::error_code why) {
    if (!events.on_peer_lost) return;
    loop.post([weak = weak_from_this(), peer, why] {
      if (auto self_ = weak.lock(); self_ && self_->running && self_->events.on_peer_lost)
        self_->events.on_peer_lost(peer, why);
    });
  }

  // ---- receive path --------------------------------------------------------------------------

  /// Posts rx slot `i`; false when the provider is busy (the slot is queued).
  bool post_rx(std::uint64_t i) {
    op* o = rx_ops[i];
    std::memset(&o->ctx, 0, sizeof(o->ctx));
    void* desc = rx_mr ? fi_mr_desc(rx_mr) : nullptr;
    const ssize_t rc =
        fi_recv(ep, rx_slab.get() + i * rx_slot(), rx_slot(), desc, FI_ADDR_UNSPEC, o);
    if (rc == -FI_EAGAIN) return false;
    if (rc) log::error("fabric: fi_recv failed: {}", fi_error_text(static_cast<int>(rc)));
    return true;
  }
  void repost_rx(std::uint64_t i) {
    if (!rx_waiting.empty() || !post_rx(i)) {
      ++counters.eagain_retries;
      ++waiting_ops;
      rx_waiting.push_back(i);
    }
  }

  void on_message(std::uint64_t slot, std::size_t len) {
    const std::byte* buf = rx_slab.get() + slot * rx_slot();
    // Some providers (shm) truncate an oversize message silently: the trailer must match.
    const std::uint32_t trailer = len >= message_overhead ? get_be32(buf + len - trailer_bytes) : 0;
    const auto kind = static_cast<message_kind>(trailer >> 30);
    const std::size_t seal = overhead(kind) - message_overhead;
    const node_id from = len >= frame_prefix_bytes ? get_be32(buf) : 0;
    if (len < message_overhead + seal || (trailer & length_mask) != len - message_overhead - seal) {
      // Unsealed where seals are due: a peer without the secret, or a truncated message.
      if (seal) return refuse_unauthenticated(from, "unsealed");
      return reject_message("truncated or malformed", len);
    }
    if (seal && !open_seal(from, buf, len)) return refuse_unauthenticated(from, "bad seal");
    const std::span payload(buf + frame_prefix_bytes, len - message_overhead - seal);
    switch (kind) {
      case message_kind::frame: {
        auto partial = partial_frames.find(from);
        if (partial == partial_frames.end()) return deliver_frame(from, payload);
        auto whole = std::move(partial->second);
        partial_frames.erase(partial);
        if (whole.dropped) return;
        if (whole.bytes.size() + payload.size() > options.max_frame) return reject_message("over the frame limit", len);
        whole.bytes.insert(whole.bytes.end(), payload.begin(), payload.end());
        return deliver_frame(from, whole.bytes);
      }
      case message_kind::fragment: {
        auto& whole = partial_frames[from];
        if (whole.dropped) return;
        if (whole.bytes.size() + payload.size() > options.max_frame) {
          whole = {.bytes = {}, .dropped = true};
          return reject_message("over the frame limit", len);
        }
        whole.bytes.insert(whole.bytes.end(), payload.begin(), payload.end());
        return;
      }
      case message_kind::notice:
        if (payload.size() != notice_bytes) return reject_message("malformed write notice", len);
        return on_write_notice(from, get_be64(payload.data()), get_be64(payload.data() + 8),
                               get_be32(payload.data() + 16));
      case message_kind::handshake:
        if (!sealed()) return reject_message("a handshake, without a job secret here", len);
        return on_handshake(from, payload);
    }
  }

  void refuse_unauthenticated(node_id claimed, const char* why) {
    // Logged at 1, 2, 4, 8, ... so a flood of forgeries cannot flood the log.
    if (const auto n = ++counters.unauthenticated; (n & (n - 1)) == 0)
      log::warn("fabric: refused {} unauthenticated message(s) so far (the last {}, claiming node {})", n, why,
                claimed);
  }

  void reject_message(const char* why, std::size_t len) {
    ++counters.frames_rejected;
    log::warn("fabric: dropped a {}-byte control message ({})", len, why);
  }

  void deliver_frame(node_id from, std::span<const std::byte> payload) {
    ++counters.frames_received;
    if (events.on_frame) events.on_frame(from, payload);
  }

  /// The region and offset of [p, p + length) if it lies inside a region we gave out.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> find_landing(const std::byte* p,
                                                                       std::uint64_t length) const {
    auto it = by_base.upper_bound(p);
    if (it == by_base.begin()) return std::nullopt;
    const auto& r = regions.at(std::prev(it)->second);
    const auto offset = static_cast<std::uint64_t>(p - r.memory.data());
    if (offset > r.memory.size() || length > r.memory.size() - offset) return std::nullopt;
    return std::pair{r.id, offset};
  }

  /// An `inject_only` writer says its write landed at `address` (ours, FI_MR_VIRT_ADDR).
  void on_write_notice(node_id from, std::uint64_t address, std::uint64_t length, write_imm imm) {
    const auto landing = find_landing(reinterpret_cast<const std::byte*>(address), length);
    if (!landing) {
      ++counters.writes_refused;
      log::error("fabric: node {} reported a write outside every registered region; dropped", from);
      return;
    }
    ++counters.writes_received;
    if (events.on_write)
      events.on_write({.from = from, .region = landing->first, .offset = landing->second, .length = length, .imm = imm});
  }

  void on_remote_write(const fi_cq_data_entry& e) {
    ++counters.writes_received;
    write_notice n{.from = 0,
                   .region = 0,
                   .offset = 0,
                   .length = e.len,
                   .imm = static_cast<write_imm>(e.data)};
    if (e.buf) {
      // Where the provider says where bytes landed, check it is inside a region we gave out.
      const auto landing = find_landing(static_cast<const std::byte*>(e.buf), e.len);
      if (landing) {
        n.region = landing->first;
        n.offset = landing->second;
      } else {
        ++counters.writes_refused;
        log::error("fabric: provider reported a write outside every registered region; dropped");
        return;
      }
    }
    if (events.on_write) events.on_write(n);
  }

  // ---- link sessions -------------------------------------------------------------------------

  bool sealed() const { return !options.secret.empty(); }
  /// Bytes a message of `kind` carries besides its body: the sender id, the trailer and, with a
  /// secret, the seal (never on a handshake).
  std::size_t overhead(message_kind kind) const {
    return message_overhead + (sealed() && kind != message_kind::handshake ? seal_bytes : 0);
  }
  /// Writes the sender id and the trailer around a body of `body` bytes already in place after
  /// the id; `message` holds `body + overhead(kind)` bytes. The seal is made as it leaves (`seal`).
  void frame_message(std::byte* message, std::size_t body, message_kind kind) const {
    put_be32(message, self);
    put_be32(message + body + overhead(kind) - trailer_bytes, make_trailer(kind, body));
  }
  /// Frames and writes to `peer` may leave: no secret, or the handshake is done.
  bool link_ready(node_id peer) const {
    if (!sealed()) return true;
    auto it = clients.find(peer);
    return it != clients.end() && it->second.at == client_session::step::ready;
  }

  /// Fills the seal of `message` (a whole message, trailer written) for `peer`'s link; the
  /// sequence number is used up only once the provider took the message (`sealed_sent`).
  void seal(node_id peer, std::byte* message, std::size_t len) {
    auto it = clients.find(peer);
    if (!sealed() || it == clients.end()) return;  // (never: nothing leaves before the handshake)
    const auto& c = it->second;
    std::byte head[frame_prefix_bytes + trailer_bytes];
    std::memcpy(head, message, frame_prefix_bytes);
    std::memcpy(head + frame_prefix_bytes, message + len - trailer_bytes, trailer_bytes);
    std::byte* at = message + len - trailer_bytes - seal_bytes;
    put_be64(at, c.next_seq);
    const auto tag = make_message_tag(c.key, c.next_seq, head,
                                      std::span(message + frame_prefix_bytes, at));
    std::memcpy(at + 8, tag.data(), tag.size());
  }
  void sealed_sent(node_id peer) {
    if (auto it = clients.find(peer); sealed() && it != clients.end()) ++it->second.next_seq;
  }

  /// Checks the seal of a message from `from`: its link's key, and a sequence number not seen.
  bool open_seal(node_id from, const std::byte* message, std::size_t len) {
    auto it = servers.find(from);
    if (it == servers.end() || !it->second.key) return false;
    auto& session = it->second;
    std::byte head[frame_prefix_bytes + trailer_bytes];
    std::memcpy(head, message, frame_prefix_bytes);
    std::memcpy(head + frame_prefix_bytes, message + len - trailer_bytes, trailer_bytes);
    const std::byte* at = message + len - trailer_bytes - seal_bytes;
    const std::uint64_t seq = get_be64(at);
    message_tag tag;
    std::memcpy(tag.data(), at + 8, tag.size());
    const auto expected = make_message_tag(*session.key, seq, head, std::span(message + frame_prefix_bytes, at));
    if (!same_tag(tag, expected) || seq < session.next_seq) return false;
    session.next_seq = seq + 1;
    return true;
  }

  /// A handshake message: [step][fields] (see `handshake_step`).
  static std::vector<std::byte> handshake_body(handshake_step step, std::initializer_list<std::span<const std::byte>> fields) {
    std::vector<std::byte> body{static_cast<std::byte>(step)};
    for (const auto f : fields) body.insert(body.end(), f.begin(), f.end());
    return body;
  }

  /// Starts our side of the link to `peer`: its frames wait until the handshake is done.
  void start_handshake(node_id peer) {
    if (!sealed() || clients.contains(peer) || !peers.contains(peer)) return;
    auto& c = clients[peer];
    c.nonce = make_link_nonce();
    send_handshake(peer, peers.at(peer), handshake_body(handshake_step::hello, {c.nonce, name}), false);
  }

  void on_handshake(node_id from, std::span<const std::byte> body) {
    if (body.empty()) return refuse_unauthenticated(from, "empty handshake");
    const auto step = static_cast<handshake_step>(body[0]);
    const auto fields = body.subspan(1);
    auto nonce_at = [&](std::size_t at) {
      link_nonce n;
      std::memcpy(n.data(), fields.data() + at, n.size());
      return n;
    };
    auto proof_at = [&](std::size_t at) {
      link_proof p;
      std::memcpy(p.data(), fields.data() + at, p.size());
      return p;
    };
    switch (step) {
      case handshake_step::hello:
        if (fields.size() <= nonce_bytes || fields.size() > nonce_bytes + 256) break;
        return on_hello(from, nonce_at(0), fields.subspan(nonce_bytes));
      case handshake_step::challenge:
        if (fields.size() != 2 * nonce_bytes + proof_bytes) break;
        return on_challenge(from, nonce_at(0), nonce_at(nonce_bytes), proof_at(2 * nonce_bytes));
      case handshake_step::proof:
        if (fields.size() != nonce_bytes + proof_bytes) break;
        return on_proof(from, nonce_at(0), proof_at(nonce_bytes));
    }
    refuse_unauthenticated(from, "malformed handshake");
  }

  /// Server: a peer claiming `from` starts a link to us; answer where its hello says it is.
  void on_hello(node_id from, const link_nonce& client_nonce, std::span<const std::byte> client_name) {
    auto& session = servers[from];
    const auto pending = std::count_if(servers.begin(), servers.end(), [](const auto& e) { return e.second.pending.has_value(); });
    if (!session.pending && static_cast<std::size_t>(pending) >= max_pending_handshakes) {
      ++counters.handshakes_refused;
      return;
    }
    release_temporary(session);
    fi_addr_t reply = FI_ADDR_UNSPEC;
    if (auto known = peer_names.find(from);
        known != peer_names.end() && std::ranges::equal(known->second, client_name)) {
      reply = peers.at(from);
    } else if (fi_av_insert(av, client_name.data(), 1, &reply, 0, nullptr) == 1) {
      session.temporary = reply;
    } else {
      return refuse_unauthenticated(from, "hello with a bad address");
    }
    const link_nonce ours = make_link_nonce();
    session.pending = std::pair{client_nonce, ours};
    const auto proof = make_link_proof(options.secret, link_role::server, client_nonce, ours, from, self);
    send_handshake(from, reply, handshake_body(handshake_step::challenge, {client_nonce, ours, proof}), false);
  }

  /// Client: the server proved the secret; prove it back, and seal from now on.
  void on_challenge(node_id from, const link_nonce& client_nonce, const link_nonce& server_nonce,
                    const link_proof& proof) {
    auto it = clients.find(from);
    if (it == clients.end() || it->second.at != client_session::step::hello_sent ||
        it->second.nonce != client_nonce)
      return refuse_unauthenticated(from, "unexpected challenge");
    const auto expected = make_link_proof(options.secret, link_role::server, client_nonce, server_nonce, self, from);
    if (!same_proof(proof, expected)) {
      ++counters.handshakes_refused;
      log::warn("fabric: node {} does not hold the job secret; giving up on it", from);
      abandon(from, transport_errc::unauthenticated);
      report_peer_lost(from, transport_errc::unauthenticated);
      return;
    }
    auto& c = it->second;
    c.key = make_link_proof(options.secret, link_role::session, client_nonce, server_nonce, self, from);
    c.next_seq = 0;
    c.at = client_session::step::proving;
    const auto ours = make_link_proof(options.secret, link_role::client, client_nonce, server_nonce, self, from);
    send_handshake(from, peers.at(from), handshake_body(handshake_step::proof, {server_nonce, ours}), true);
  }

  /// Server: the client proved the secret; its sealed messages are accepted from now on.
  void on_proof(node_id from, const link_nonce& server_nonce, const link_proof& proof) {
    auto it = servers.find(from);
    if (it == servers.end() || !it->second.pending || it->second.pending->second != server_nonce)
      return refuse_unauthenticated(from, "unexpected proof");
    auto& session = it->second;
    const auto [client_nonce, ours] = *session.pending;
    session.pending.reset();
    release_temporary(session);
    if (!same_proof(proof, make_link_proof(options.secret, link_role::client, client_nonce, ours, from, self))) {
      ++counters.handshakes_refused;
      log::warn("fabric: a peer claiming node {} does not hold the job secret", from);
      return;
    }
    session.key = make_link_proof(options.secret, link_role::session, client_nonce, ours, from, self);
    session.next_seq = 0;
  }

  void release_temporary(server_session& session) {
    if (session.temporary) fi_av_remove(av, &*session.temporary, 1, 0);
    session.temporary.reset();
  }

  void send_handshake(node_id peer, fi_addr_t addr, std::vector<std::byte> body, bool readies) {
    const auto id = next_op_id++;
    auto& h = handshakes[id];
    h.bytes.resize(body.size() + overhead(message_kind::handshake));
    std::memcpy(h.bytes.data() + frame_prefix_bytes, body.data(), body.size());
    frame_message(h.bytes.data(), body.size(), message_kind::handshake);
    h.addr = addr;
    h.peer = peer;
    h.readies = readies;
    h.since = std::chrono::steady_clock::now();
    if (!handshakes_waiting.empty() || !issue_handshake(id)) handshakes_waiting.push_back(id);
    poke();
  }

  /// False on -FI_EAGAIN. Failures are only logged: the link's traffic notices a dead peer.
  bool issue_handshake(std::uint64_t id) {
    auto& h = handshakes.at(id);
    ssize_t rc;
    op* o = nullptr;
    if (h.bytes.size() <= inject_limit) {
      rc = fi_inject(ep, h.bytes.data(), h.bytes.size(), h.addr);
    } else {
      o = take_op(op_kind::handshake, id);
      rc = fi_send(ep, h.bytes.data(), h.bytes.size(), nullptr, h.addr, o);
    }
    if (rc == -FI_EAGAIN) {
      if (o) give_op(o);
      return false;
    }
    if (rc) {
      if (o) give_op(o);
      log::debug("fabric: handshake message to node {} failed: {}", h.peer, fi_error_text(static_cast<int>(rc)));
      handshakes.erase(id);
      return true;
    }
    if (h.readies) {
      if (auto c = clients.find(h.peer); c != clients.end() && c->second.at == client_session::step::proving)
        c->second.at = client_session::step::ready;
    }
    if (!o) handshakes.erase(id);
    return true;
  }

  void retry_handshakes() {
    const auto now = std::chrono::steady_clock::now();
    while (running && !handshakes_waiting.empty()) {
      const auto id = handshakes_waiting.front();
      if (now - handshakes.at(id).since > options.stall_timeout) {
        handshakes.erase(id);  // its peer's traffic, if any, notices the stall
      } else if (!issue_handshake(id)) {
        return;
      }
      handshakes_waiting.pop_front();
    }
  }

  // ---- send path -----------------------------------------------------------------------------

  /// Issues send `id`; false on -FI_EAGAIN.
  bool issue_send(std::uint64_t id) {
    auto& s = sends.at(id);
    if (auto p = peers.find(s.peer); p != peers.end()) s.addr = p->second;  // after a reconnect
    if (inject_only) return inject_send(id);
    seal(s.peer, s.bytes.data(), s.bytes.size());
    op* o = take_op(op_kind::send, id);
    void* desc = s.mr ? fi_mr_desc(s.mr) : nullptr;
    const ssize_t rc = fi_send(ep, s.bytes.data(), s.bytes.size(), desc, s.addr, o);
    if (rc == -FI_EAGAIN) {
      give_op(o);
      return false;
    }
    if (rc) {
      give_op(o);
      log::warn("fabric: fi_send to node {} failed: {}", s.peer,
                fi_error_text(static_cast<int>(rc)));
      finish_send(id, map_op_error(static_cast<int>(-rc)));
      return true;
    }
    s.issued = true;
    sealed_sent(s.peer);
    op_accepted(s.peer);
    // rxm sends a frame above its eager size by another protocol, whose receive completes after
    // those of smaller frames sent later (even under FI_ORDER_SAS): until such a frame is done,
    // nothing else leaves for that peer. Frames within inject_size are always eager.
    if (s.bytes.size() > inject_limit) {
      s.holds_order = true;
      ++traffic[s.peer].order_holders;
    }
    return true;
  }

  /// Injects what is left of send `id`, in fragments if it is larger than the provider injects.
  /// Injected messages have no completion: the send is done once the last is accepted.
  bool inject_send(std::uint64_t id) {
    auto& s = sends.at(id);
    const std::size_t extra = overhead(message_kind::frame);
    const std::span payload(s.bytes.data() + frame_prefix_bytes, s.bytes.size() - extra);
    if (s.bytes.size() <= inject_limit) {
      seal(s.peer, s.bytes.data(), s.bytes.size());
      const ssize_t rc = fi_inject(ep, s.bytes.data(), s.bytes.size(), s.addr);
      if (rc == -FI_EAGAIN) return false;
      return finish_injected(id, rc);
    }
    std::vector<std::byte> piece(inject_limit);
    const std::size_t room = inject_limit - extra;
    while (s.injected < payload.size()) {
      const std::size_t n = std::min(room, payload.size() - s.injected);
      const bool last = s.injected + n == payload.size();
      std::memcpy(piece.data() + frame_prefix_bytes, payload.data() + s.injected, n);
      frame_message(piece.data(), n, last ? message_kind::frame : message_kind::fragment);
      seal(s.peer, piece.data(), n + extra);
      const ssize_t rc = fi_inject(ep, piece.data(), n + extra, s.addr);
      if (rc == -FI_EAGAIN) return false;
      if (rc) return finish_injected(id, rc);
      sealed_sent(s.peer);
      s.injected += n;
      note_progress(s.peer);
    }
    return finish_injected(id, 0, false);
  }
  /// `rc` is the last fi_inject's; a whole message injected at once (`sealed_now`) used up a
  /// sequence number.
  bool finish_injected(std::uint64_t id, ssize_t rc, bool sealed_now = true) {
    const auto peer = sends.at(id).peer;
    if (rc) {
      log::warn("fabric: fi_inject to node {} failed: {}", peer, fi_error_text(static_cast<int>(rc)));
    } else {
      if (sealed_now) sealed_sent(peer);
      note_progress(peer);
    }
    finish_send(id, rc ? map_op_error(static_cast<int>(-rc)) : std::error_code{});
    return true;
  }

  void finish_send(std::uint64_t id, std::error_code ec) {
    auto it = sends.find(id);
    if (it == sends.end()) return;
    auto s = std::move(it->second);
    sends.erase(it);
    if (s.mr) fi_close(&s.mr->fid);
    if (s.orphaned) return;
    post_done(std::move(s.done), ec);
    if (is_link_error(ec)) report_peer_lost(s.peer, ec);
  }

  /// A send completed (or failed) at the provider.
  void on_send_done(op* o, std::error_code ec) {
    const auto id = o->owner;
    give_op(o);
    if (auto it = sends.find(id); it != sends.end()) {
      const auto& st = it->second;
      if (st.holds_order && !st.orphaned) --traffic[st.peer].order_holders;
      op_completed(st.peer, st.orphaned);
    }
    finish_send(id, ec);
  }

  // ---- write path ----------------------------------------------------------------------------

  /// Issues what it can of write `id`: body pieces, then (after they landed) the final piece
  /// carrying the immediate. False on -FI_EAGAIN.
  bool pump_write(std::uint64_t id) {
    auto it = writes.find(id);
    if (it == writes.end()) return true;
    auto& w = it->second;
    while (!w.error && w.issued < w.body_end) {
      const std::uint64_t n = std::min(max_piece, w.body_end - w.issued);
      const ssize_t rc = issue_piece(w, id, w.issued, n, false);
      if (rc == -FI_EAGAIN) return false;
      if (rc) {
        w.error = map_op_error(static_cast<int>(-rc));
        break;
      }
      w.issued += n;
    }
    if (!w.error && !w.final_issued && w.landed == w.body_end) {
      const ssize_t rc = inject_only ? inject_notice(w) : issue_piece(w, id, w.body_end, w.length - w.body_end, true);
      if (rc == -FI_EAGAIN) return false;
      if (rc)
        w.error = map_op_error(static_cast<int>(-rc));
      else
        w.final_issued = true;
    }
    maybe_finish_write(id);
    return true;
  }

  /// `inject_only`: every byte of `w` landed; tell its target.
  ssize_t inject_notice(write_state& w) {
    std::byte message[message_overhead + notice_bytes + seal_bytes];
    const std::size_t len = notice_bytes + overhead(message_kind::notice);
    put_be64(message + frame_prefix_bytes, w.remote_addr);
    put_be64(message + frame_prefix_bytes + 8, w.length);
    put_be32(message + frame_prefix_bytes + 16, w.imm);
    frame_message(message, notice_bytes, message_kind::notice);
    seal(w.peer, message, len);
    const ssize_t rc = fi_inject(ep, message, len, w.addr);
    if (rc == 0) {
      sealed_sent(w.peer);
      note_progress(w.peer);
    }
    if (rc && rc != -FI_EAGAIN)
      log::warn("fabric: write notice to node {} failed: {}", w.peer, fi_error_text(static_cast<int>(rc)));
    return rc;
  }

  ssize_t issue_piece(write_state& w, std::uint64_t id, std::uint64_t at, std::uint64_t n,
                      bool final) {
    op* o = take_op(op_kind::write, id, n);
    iovec iov{const_cast<std::byte*>(w.src + at), n};
    void* desc = w.desc;
    fi_rma_iov rma{w.remote_addr + at, n, w.key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.desc = &desc;
    msg.iov_count = 1;
    msg.addr = w.addr;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = o;
    msg.data = final ? w.imm : 0;
    // Delivery complete: the writer's completion means the bytes are at the target. (shm copies
    // a write without CQ data in the call, so its completion already means that.)
    const std::uint64_t flags = FI_COMPLETION | (inject_only ? 0 : FI_DELIVERY_COMPLETE) |
                                (final ? FI_REMOTE_CQ_DATA : 0);
    const ssize_t rc = fi_writemsg(ep, &msg, flags);
    if (rc) {
      give_op(o);
      if (rc != -FI_EAGAIN)
        log::warn("fabric: fi_writemsg to node {} failed: {}", w.peer,
                  fi_error_text(static_cast<int>(rc)));
      return rc;
    }
    ++w.in_flight;
    op_accepted(w.peer);
    return 0;
  }

  void maybe_finish_write(std::uint64_t id) {
    auto it = writes.find(id);
    if (it == writes.end()) return;
    auto& w = it->second;
    // `inject_only` writes every byte in the body; the notice has no completion.
    const bool done = w.in_flight == 0 && (w.error || (w.final_issued && w.landed == w.length));
    if (!done) return;
    auto state = std::move(w);
    writes.erase(it);
    if (state.error) ++counters.writes_refused;
    if (state.orphaned) return;
    post_done(std::move(state.done), state.error);
    if (is_link_error(state.error)) report_peer_lost(state.peer, state.error);
  }

  void on_piece_done(op* o, std::error_code ec) {
    const std::uint64_t id = o->owner;
    const std::uint64_t bytes = o->bytes;
    give_op(o);
    auto it = writes.find(id);
    if (it == writes.end()) return;  // never: a write outlives its pieces
    auto& w = it->second;
    op_completed(w.peer, w.orphaned);
    --w.in_flight;
    if (ec && !w.error) w.error = ec;
    if (!ec) w.landed += bytes;
    if (!w.queued && !w.error) {
      const auto peer = w.peer;
      if (!pump_write(id)) {
        writes.at(id).queued = true;
        enqueue(peer, {op_kind::write, id});
      }
    } else {
      maybe_finish_write(id);
    }
  }

  // ---- progress ------------------------------------------------------------------------------

  /// `peer` took something that has no completion.
  void note_progress(node_id peer) { traffic[peer].last_progress = std::chrono::steady_clock::now(); }

  /// The provider accepted an operation to `peer`.
  void op_accepted(node_id peer) {
    ++tx_in_flight;
    auto& t = traffic[peer];
    ++t.in_flight;
    t.last_progress = std::chrono::steady_clock::now();
  }
  /// An operation the provider accepted completed; one of a peer given up on counts apart.
  void op_completed(node_id peer, bool abandoned) {
    --tx_in_flight;
    if (abandoned) {
      --abandoned_in_flight;
      return;
    }
    auto& t = traffic[peer];
    --t.in_flight;
    t.last_progress = std::chrono::steady_clock::now();
  }

  void enqueue(node_id peer, blocked b) {
    if (link_ready(peer)) ++counters.eagain_retries;
    ++waiting_ops;
    auto& t = traffic[peer];
    if (t.idle()) t.last_progress = std::chrono::steady_clock::now();
    t.waiting.push_back(b);
    start_handshake(peer);
  }
  /// Nothing may overtake an operation that waits for the same peer.
  bool must_wait(node_id peer) const {
    auto it = traffic.find(peer);
    return !link_ready(peer) ||
           (it != traffic.end() && (!it->second.waiting.empty() || it->second.order_holders > 0));
  }

  /// Retries what the provider refused with -FI_EAGAIN: receive slots, then each peer's
  /// operations in order, until the provider refuses that peer's next one.
  void retry_waiting() {
    while (running && !rx_waiting.empty() && post_rx(rx_waiting.front())) {
      rx_waiting.pop_front();
      --waiting_ops;
    }
    retry_handshakes();
    for (auto& [peer, t] : traffic) {
      while (running && !t.waiting.empty() && t.order_holders == 0 && link_ready(peer) &&
             retry(t.waiting.front())) {
        t.waiting.pop_front();
        --waiting_ops;
      }
    }
  }
  /// False while the provider still refuses `b`.
  bool retry(blocked b) {
    if (b.kind == op_kind::send) return !sends.contains(b.id) || issue_send(b.id);
    auto it = writes.find(b.id);
    if (it == writes.end()) return true;
    it->second.queued = false;
    if (pump_write(b.id)) return true;
    writes.at(b.id).queued = true;
    return false;
  }

  /// Fails everything outstanding to `peer` now. Operations the provider holds keep their
  /// contexts until they complete, if ever, and no longer keep progress hot meanwhile.
  void abandon(node_id peer, std::error_code why) {
    clients.erase(peer);  // the next frame starts a new handshake
    // Its handshake messages the provider has not taken go too: they wait in one queue for every
    // peer, and one the provider keeps refusing holds up the handshakes to live peers behind it.
    std::erase_if(handshakes_waiting, [&](std::uint64_t id) {
      const auto h = handshakes.find(id);
      if (h == handshakes.end() || h->second.peer != peer) return false;
      handshakes.erase(h);
      return true;
    });
    if (auto t = traffic.find(peer); t != traffic.end()) {
      waiting_ops -= t->second.waiting.size();
      abandoned_in_flight += t->second.in_flight;
      traffic.erase(t);
    }
    for (auto it = sends.begin(); it != sends.end();) {
      auto& st = it->second;
      if (st.peer != peer || st.orphaned) {
        ++it;
        continue;
      }
      post_done(std::move(st.done), why);
      if (st.issued) {
        st.orphaned = true;
        ++it;
      } else {
        if (st.mr) fi_close(&st.mr->fid);
        it = sends.erase(it);
      }
    }
    for (auto it = writes.begin(); it != writes.end();) {
      auto& w = it->second;
      if (w.peer != peer || w.orphaned) {
        ++it;
        continue;
      }
      post_done(std::move(w.done), why);
      if (w.in_flight > 0) {
        w.orphaned = true;
        w.error = why;
        ++it;
      } else {
        it = writes.erase(it);
      }
    }
  }

  /// A dead peer never takes what waits for it nor completes what it was given: after
  /// `stall_timeout` without either, give up on it and report it lost, as a dropped link is.
  void give_up_on_stalled_peers() {
    const auto now = std::chrono::steady_clock::now();
    if (now < next_stall_check) return;
    next_stall_check = now + stall_check_period;
    std::vector<node_id> stalled;
    for (const auto& [peer, t] : traffic)
      if (!t.idle() && now - t.last_progress > options.stall_timeout) stalled.push_back(peer);
    for (const auto peer : stalled) {
      const auto& t = traffic.at(peer);
      log::warn("fabric: node {} took nothing for {} ms ({} operation(s) waiting, {} in flight); giving up on it",
                peer, options.stall_timeout.count(), t.waiting.size(), t.in_flight);
      ++counters.peers_stalled;
      abandon(peer, transport_errc::peer_stalled);
      report_peer_lost(peer, transport_errc::peer_stalled);
    }
  }

  void handle_entry(const fi_cq_data_entry& e) {
    auto* o = static_cast<op*>(e.op_context);
    if (e.flags & FI_REMOTE_CQ_DATA && (e.flags & FI_REMOTE_WRITE || !(e.flags & FI_MSG))) {
      on_remote_write(e);
      // Under FI_RX_CQ_DATA a write with data consumed one of our receive buffers.
      if (o && o->kind == op_kind::recv) repost_rx(o->owner);
      return;
    }
    if (!o) return;
    switch (o->kind) {
      case op_kind::recv:
        on_message(o->owner, e.len);
        if (running) repost_rx(o->owner);
        break;
      case op_kind::send:
        on_send_done(o, {});
        break;
      case op_kind::write:
        on_piece_done(o, {});
        break;
      case op_kind::handshake:
        handshakes.erase(o->owner);
        give_op(o);
        break;
    }
  }

  void handle_error(const fi_cq_err_entry& e) {
    auto* o = static_cast<op*>(e.op_context);
    const auto ec = map_op_error(e.err);
    if (!o) {
      // A remote operation failed at this target (e.g. a write with a bad key): count it.
      ++counters.writes_refused;
      log::warn("fabric: remote operation failed here: {}", fi_error_text(e.err));
      return;
    }
    switch (o->kind) {
      case op_kind::recv:
        ++counters.frames_rejected;
        log::warn("fabric: dropped a control frame ({}; {} bytes over the {}-byte limit?)",
                  fi_error_text(e.err), e.olen, options.max_frame);
        if (running) repost_rx(o->owner);
        break;
      case op_kind::send:
        log::warn("fabric: control frame failed: {}", fi_error_text(e.err));
        on_send_done(o, ec);
        break;
      case op_kind::write:
        log::warn("fabric: write failed: {} (provider errno {})", fi_error_text(e.err),
                  e.prov_errno);
        on_piece_done(o, ec);
        break;
      case op_kind::handshake:
        log::debug("fabric: a handshake message failed: {}", fi_error_text(e.err));
        handshakes.erase(o->owner);
        give_op(o);
        break;
    }
  }

  /// Reads completions (which also drives the provider's progress) and retries waiting ops.
  int drain() {
    if (!running) return 0;
    auto keep = shared_from_this();  // a callback may drop the last owner of the transport
    int handled = 0;
    fi_cq_data_entry entries[16];
    while (running && handled < drain_budget) {
      const ssize_t n = fi_cq_read(cq, entries, 16);
      if (n > 0) {
        for (ssize_t i = 0; i < n && running; ++i) handle_entry(entries[i]);
        handled += static_cast<int>(n);
        continue;
      }
      if (n == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        if (fi_cq_readerr(cq, &err, 0) > 0) handle_error(err);
        ++handled;
        continue;
      }
      if (n != -FI_EAGAIN)
        log::error("fabric: fi_cq_read failed: {}", fi_error_text(static_cast<int>(n)));
      break;
    }
    if (running) retry_waiting();
    if (running) give_up_on_stalled_peers();
    return handled;
  }

  bool busy() const { return tx_in_flight > abandoned_in_flight || waiting_ops > 0; }
  /// Work in flight, or traffic within `active_window`: progress must run continuously.
  bool hot() const { return busy() || std::chrono::steady_clock::now() < active_until; }

  /// Drives progress now and decides how to be woken next.
  void kick() {
    if (!running) return;
    auto keep = shared_from_this();
    const int handled = drain();
    if (!running) return;
    if (handled > 0) active_until = std::chrono::steady_clock::now() + active_window;
    // Quiet turns back the polling off, work in flight or not: with a wait fd, the fd wakes us
    // for what it covers, and the timer for what it may not (rxm's connection set-up).
    if (handled > 0 || (busy() && !wait_fd))
      idle_streak = 0;
    else if (idle_streak < 16)
      ++idle_streak;
    rearm();
  }

  /// While hot, a fiber posts one kick per loop turn and yields: progress is continuous, and
  /// other handlers and fibers still take turns. (A handler that re-posted itself would keep
  /// io_context::poll() from returning, and event_loop::turn runs fibers only after it does.)
  void start_pump() {
    if (pumping || !running) return;
    pumping = true;
    loop.spawn([weak = weak_from_this()] {
      for (;;) {
        {
          auto self_ = weak.lock();
          if (!self_) return;
          // Our last kick has not run: the loop runs no handlers (it stopped, or the thread is
          // exiting and only fibers are resumed). Stop; that kick restarts us if it ever runs.
          if (!self_->running || self_->kick_posted) {
            self_->pumping = false;
            return;
          }
          if (!self_->hot() || self_->arm_wait_fd()) {
            self_->pumping = false;
            self_->rearm();  // back to the wait fd or the backing-off timer
            return;
          }
          self_->kick_posted = true;
          self_->loop.post([weak] {
            if (auto s = weak.lock()) {
              s->kick_posted = false;
              s->kick();
            }
          });
        }
        boost::this_fiber::yield();
      }
    });
  }

  /// Sleeps on the wait fd when the provider says that is safe (fi_trywait: nothing moves until
  /// the fd fires), work in flight or not; false when it is not, or there is no fd.
  bool arm_wait_fd() {
    if (!wait_fd) return false;
    if (fd_armed) return true;
    if (fid * fids[1] = {&cq->fid}; fi_trywait(fabric, fids, 1) != FI_SUCCESS) return false;
    fd_armed = true;
    wait_fd->async_wait(asio::posix::stream_descriptor::wait_read,
                        [weak = weak_from_this()](const boost::system::error_code& ec) {
                          auto self_ = weak.lock();
                          if (!self_ || ec == asio::error::operation_aborted) return;
                          self_->fd_armed = false;
                          // Bytes are arriving: a large write streams in long before its
                          // completion, and moves only while we poll.
                          self_->active_until = std::chrono::steady_clock::now() + active_window;
                          self_->kick();
                        });
    return true;
  }

  void rearm() {
    // Progress runs continuously while work is in flight, unless the provider lets us sleep on
    // its fd: a core spinning for every busy process starves the others on a shared host.
    const bool fd_ok = arm_wait_fd();
    if (hot() && !fd_ok) return start_pump();
    // Idle: sleep on the fd alone; with work in flight, or without an fd (or while fi_trywait
    // says events are pending), also poll on a timer that backs off while nothing happens.
    if (fd_ok && idle_streak > 0 && !busy()) return;
    arm_timer(std::min(first_idle_poll * (1u << std::min(idle_streak, 8u)), idle_interval));
  }

  void arm_timer(std::chrono::steady_clock::duration after) {
    const auto deadline = std::chrono::steady_clock::now() + after;
    if (timer_armed && timer_deadline <= deadline) return;
    timer_armed = true;
    timer_deadline = deadline;
    timer.expires_at(deadline);
    timer.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      auto self_ = weak.lock();
      if (!self_ || ec == asio::error::operation_aborted) return;
      self_->timer_armed = false;
      self_->kick();
    });
  }

  /// Starts continuous progress after new work was issued from outside a drain.
  void poke() {
    idle_streak = 0;
    start_pump();
  }
};

// ---- fabric_transport ----------------------------------------------------------------------

result<std::shared_ptr<fabric_transport>> fabric_transport::make(event_loop& loop, node_id self,
                                                                 fabric_options options) {
  if (options.max_frame < frame_prefix_bytes + 1 || options.max_frame > length_mask || options.rx_buffers == 0)
    return fail(errc::invalid_argument);
  auto state = std::make_shared<impl>(loop, self, std::move(options));
  if (auto ec = state->open()) return fail(ec);
  state->open_watch();
  return std::shared_ptr<fabric_transport>(new fabric_transport(std::move(state)));
}

fabric_transport::fabric_transport(std::shared_ptr<impl> state) : impl_(std::move(state)) {}

fabric_transport::~fabric_transport() {
  close();
}

std::string fabric_transport::local_address() const {
  return impl_->watch ? impl_->name_hex + "@" + impl_->watch->address() : impl_->name_hex;
}
std::string fabric_transport::provider() const {
  return impl_->provider_name;
}

result<region_desc> fabric_transport::register_device_region(std::span<std::byte>, int device, std::string& why) {
  // A provider with FI_HMEM would take GPU memory through fi_mr_regattr (iface FI_HMEM_CUDA); no
  // run has exercised that yet, and a path no run has exercised is not offered.
  why = fmt::format("libfabric provider '{}': ferry registers no GPU memory with libfabric yet (GPUDirect RDMA, "
                    "FI_HMEM), so GPU {} is reached through host memory",
                    impl_->provider_name, device);
  return fail(errc::invalid_argument);
}
std::string_view fabric_transport::progress_mode() const {
  return impl_->wait_fd ? "wait-fd" : "timer";
}
const fabric_stats& fabric_transport::stats() const {
  return impl_->counters;
}

std::error_code fabric_transport::start(transport_events events) {
  auto& s = *impl_;
  if (s.closed) return errc::stopped;
  if (s.running) return {};
  if (!s.sealed() && !s.options.allow_unauthenticated) {
    log::warn("fabric: node {} has no job secret (set one, or allow unauthenticated links)", s.self);
    return transport_errc::unauthenticated;
  }
  s.events = std::move(events);
  s.running = true;
  for (std::size_t i = 0; i < s.rx_ops.size(); ++i) s.repost_rx(i);
  s.kick();
  return {};
}

void fabric_transport::close() {
  impl_->shutdown();
}

std::error_code fabric_transport::add_peer(node_id peer, std::string_view address) {
  auto& s = *impl_;
  if (s.closed) return errc::stopped;
  const auto at = address.find('@');  // the endpoint's name, then its watch's host:port
  auto blob = hex_decode(address.substr(0, at));
  if (!blob) return blob.error();
  if (auto it = s.peers.find(peer); it != s.peers.end()) {
    fi_av_remove(s.av, &it->second, 1, 0);
    s.peers.erase(it);
    // Another process under the same id: what was outstanding for the old one fails, and the
    // link to the new one starts with a new handshake.
    if (s.peer_names[peer] != *blob) s.abandon(peer, transport_errc::connection_lost);
  }
  fi_addr_t addr = FI_ADDR_UNSPEC;
  const int n = fi_av_insert(s.av, blob->data(), 1, &addr, 0, nullptr);
  if (n != 1) {
    log::warn("fabric: fi_av_insert for node {} failed ({})", peer, n);
    return transport_errc::bad_address;
  }
  s.peers[peer] = addr;
  s.peer_names[peer] = std::move(*blob);
  if (s.watch && at != std::string_view::npos) s.watch->watch(peer, address.substr(at + 1));
  return {};
}

void fabric_transport::remove_peer(node_id peer) {
  auto& s = *impl_;
  auto it = s.peers.find(peer);
  if (it == s.peers.end()) return;
  s.abandon(peer, transport_errc::peer_unreachable);
  s.partial_frames.erase(peer);
  s.clients.erase(peer);
  // A proven link from it stays: fabric has no connection whose end would tell a member given up
  // while cut off, so it still seals with that key when the link returns, and must be heard.
  if (auto server = s.servers.find(peer); server != s.servers.end()) {
    s.release_temporary(server->second);
    server->second.pending.reset();
    if (!server->second.key) s.servers.erase(server);
  }
  fi_av_remove(s.av, &it->second, 1, 0);
  s.peers.erase(it);
  s.peer_names.erase(peer);
  if (s.watch) s.watch->forget(peer);
}

void fabric_transport::async_send(node_id to, frame f, completion done) {
  auto& s = *impl_;
  if (!s.running) return s.post_done(std::move(done), errc::stopped);
  auto peer = s.peers.find(to);
  if (peer == s.peers.end()) return s.post_done(std::move(done), transport_errc::peer_unreachable);
  if (f.size() < frame_prefix_bytes) return s.post_done(std::move(done), errc::invalid_argument);
  if (f.size() > s.options.max_frame) return s.post_done(std::move(done), errc::oversize_frame);
  // The CQ entry has the length, so the prefix carries our node id instead; the length moves
  // to a trailer, which exposes a truncated message.
  const auto payload = f.size() - frame_prefix_bytes;
  f.resize(payload + s.overhead(message_kind::frame));
  s.frame_message(f.data(), payload, message_kind::frame);
  const auto id = s.next_op_id++;
  auto& st = s.sends[id];
  st.bytes = std::move(f);
  st.done = std::move(done);
  st.peer = to;
  st.addr = peer->second;
  if (s.mr_mode & FI_MR_LOCAL) {
    if (auto ec = s.register_memory(st.bytes.data(), st.bytes.size(), FI_SEND, st.mr)) {
      auto d = std::move(st.done);
      s.sends.erase(id);
      return s.post_done(std::move(d), ec);
    }
  }
  if (s.must_wait(to) || !s.issue_send(id)) s.enqueue(to, {op_kind::send, id});
  s.poke();
}

result<region_desc> fabric_transport::register_region(std::span<std::byte> memory) {
  auto& s = *impl_;
  if (s.closed) return fail(errc::stopped);
  if (memory.empty()) return fail(errc::invalid_argument);
  impl::region r;
  r.id = s.next_region++;
  r.memory = memory;
  std::error_code ec;
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::uint64_t key = 0;
    if (!(s.mr_mode & FI_MR_PROV_KEY)) {
      key = s.keys();
      const auto bits = 8 * s.info->domain_attr->mr_key_size;
      if (bits > 0 && bits < 64) key &= (std::uint64_t{1} << bits) - 1;
    }
    ec = s.register_memory(memory.data(), memory.size(), FI_REMOTE_WRITE | FI_WRITE, r.mr, key);
    if (!ec) break;
  }
  if (ec) return fail(ec);
  r.desc = fi_mr_desc(r.mr);
  r.key = fi_mr_key(r.mr);
  const region_desc desc{
      .owner = s.self,
      .id = r.id,
      .addr = (s.mr_mode & FI_MR_VIRT_ADDR) ? reinterpret_cast<std::uint64_t>(memory.data()) : 0,
      .key = r.key,
      .length = memory.size()};
  s.by_base[memory.data()] = r.id;
  s.regions.emplace(r.id, r);
  return desc;
}

void fabric_transport::deregister_region(std::uint64_t region_id) {
  auto& s = *impl_;
  auto it = s.regions.find(region_id);
  if (it == s.regions.end()) return;
  if (it->second.mr) fi_close(&it->second.mr->fid);
  // The same memory may have been registered again meanwhile (a new key for it): only this
  // region's entry goes.
  if (auto base = s.by_base.find(it->second.memory.data()); base != s.by_base.end() && base->second == region_id)
    s.by_base.erase(base);
  s.regions.erase(it);
}

void fabric_transport::async_write(std::span<const std::byte> local, const region_desc& remote,
                                   std::uint64_t offset, write_imm imm, completion done) {
  auto& s = *impl_;
  auto refuse = [&](std::error_code ec) {
    ++s.counters.writes_refused;
    s.post_done(std::move(done), ec);
  };
  if (!s.running) return s.post_done(std::move(done), errc::stopped);
  auto peer = s.peers.find(remote.owner);
  if (peer == s.peers.end()) return refuse(transport_errc::peer_unreachable);
  // The peer's provider checks key and range too; checking the length here refuses the
  // common mistake before anything is sent.
  if (offset > remote.length || local.size() > remote.length - offset)
    return refuse(transport_errc::out_of_bounds);
  const impl::region* src = nullptr;
  if (auto it = s.by_base.upper_bound(local.data()); it != s.by_base.begin()) {
    const auto& r = s.regions.at(std::prev(it)->second);
    if (local.data() + local.size() <= r.memory.data() + r.memory.size()) src = &r;
  }
  if (!src) return refuse(transport_errc::not_registered);

  const auto id = s.next_op_id++;
  auto& w = s.writes[id];
  w.done = std::move(done);
  w.peer = remote.owner;
  w.addr = peer->second;
  w.src = local.data();
  w.length = local.size();
  w.desc = src->desc;
  w.remote_addr = remote.addr + offset;
  w.key = remote.key;
  w.imm = imm;
  // Everything but the last piece goes first without data; the last carries the immediate
  // once the rest has landed, so the receiver's notice means the whole write is there.
  w.body_end = w.length > s.max_piece ? w.length - ((w.length - 1) % s.max_piece + 1) : 0;
  if (s.inject_only) w.body_end = w.length;
  if (s.must_wait(remote.owner) || !s.pump_write(id)) {
    if (auto it = s.writes.find(id); it != s.writes.end()) {
      it->second.queued = true;
      s.enqueue(remote.owner, {op_kind::write, id});
    }
  }
  s.poke();
}

std::size_t remove_shm_regions_of(pid_t pid) {
  const auto prefix = std::to_string(pid) + ":" + std::to_string(getuid()) + ":";
  std::size_t removed = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/dev/shm", ec), end; !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (!name.starts_with(prefix) || name.size() == prefix.size() ||
        !std::all_of(name.begin() + static_cast<std::ptrdiff_t>(prefix.size()), name.end(),
                     [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    std::error_code gone;
    removed += std::filesystem::remove(it->path(), gone);
  }
  return removed;
}

}  // namespace ferry
