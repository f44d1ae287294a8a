#pragma once
/// The state of one fabric transport, shared by its files: `fabric_transport.cpp` (the public
/// calls, opening, closing and completions), `inbound.cpp` (messages, handshakes and write
/// notices arriving) and `outbound.cpp` (sends, writes and handshakes leaving, and what waits).
#include <rdma/fabric.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <unordered_map>
#include <vector>

#include "transport/fabric/endpoint.hpp"
#include "transport/fabric/fabric_transport.hpp"
#include "transport/fabric/frame_assembly.hpp"
#include "transport/fabric/link_sessions.hpp"
#include "transport/fabric/message_format.hpp"
#include "transport/fabric/peer_traffic.hpp"
#include "transport/fabric/progress.hpp"
#include "transport/peer_watch.hpp"

namespace ferry {

struct fabric_transport::impl : std::enable_shared_from_this<impl> {
  using message_kind = fabric_link::message_kind;
  using op = fabric_link::op;
  using op_kind = fabric_link::op_kind;
  using waiting_op = fabric_link::waiting_op;

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
    fid_mr* mr = nullptr;      ///< only under FI_MR_LOCAL
    std::size_t injected = 0;  ///< payload bytes injected so far (`inject_only`)
    bool issued = false;       ///< the provider holds it
    bool holds_order = false;  ///< later traffic to the peer waits for its completion
    bool orphaned = false;     ///< its caller was told it failed; the provider still holds it
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
  /// A handshake message on its way. It never counts as a peer's traffic, so a stranger's hello
  /// cannot stall or fail a member's link.
  struct handshake_out {
    std::vector<std::byte> bytes;
    fi_addr_t addr = FI_ADDR_UNSPEC;
    node_id peer = 0;
    bool readies = false;  ///< our proof: the link is ready once the provider took it
    std::chrono::steady_clock::time_point since{};
  };

  impl(event_loop& l, node_id s, fabric_options o);
  ~impl() { shutdown(); }

  // fabric_transport.cpp: opening, closing, completions
  std::error_code open();
  void open_watch();
  void peer_ended(node_id peer);
  void shutdown();
  void fail_everything_in_flight();
  void post_done(completion done, std::error_code ec);
  void report_peer_lost(node_id peer, std::error_code why);
  int drain();
  void handle_entry(const fi_cq_data_entry& e);
  void handle_error(const fi_cq_err_entry& e);
  bool busy() const { return traffic.busy() || !rx_waiting.empty(); }
  const region* region_holding(std::span<const std::byte> local) const;

  // inbound.cpp: what arrives
  std::size_t rx_slot() const { return options.max_frame + fabric_link::trailer_bytes; }
  bool post_rx(std::uint64_t i);
  void repost_rx(std::uint64_t i);
  void on_message(std::uint64_t slot, std::size_t len);
  void on_piece(node_id from, std::span<const std::byte> payload, bool last, std::size_t len);
  void refuse_unauthenticated(node_id claimed, const char* why);
  void reject_message(const char* why, std::size_t len);
  void deliver_frame(node_id from, std::span<const std::byte> payload);
  std::optional<std::pair<std::uint64_t, std::uint64_t>> find_landing(const std::byte* p,
                                                                      std::uint64_t length) const;
  void on_write_notice(node_id from, const fabric_link::notice& n);
  void on_remote_write(const fi_cq_data_entry& e);
  void on_handshake(node_id from, std::span<const std::byte> body);
  void on_hello(node_id from, const fabric_link::handshake_message& hello);
  void on_challenge(node_id from, const fabric_link::handshake_message& challenge);
  void on_proof(node_id from, const fabric_link::handshake_message& proof);
  void release_temporary(node_id peer);

  // outbound.cpp: what leaves, and what waits
  bool sealed() const { return sessions.sealed(); }
  std::size_t overhead(message_kind kind) const;
  void frame_message(std::byte* message, std::size_t body, message_kind kind) const;
  void start_handshake(node_id peer);
  void send_handshake(node_id peer, fi_addr_t addr, std::vector<std::byte> body, bool readies);
  bool issue_handshake(std::uint64_t id);
  void retry_handshakes();
  bool issue_send(std::uint64_t id);
  bool inject_send(std::uint64_t id);
  bool finish_injected(std::uint64_t id, ssize_t rc, bool sealed_now = true);
  void finish_send(std::uint64_t id, std::error_code ec);
  void on_send_done(op* o, std::error_code ec);
  bool pump_write(std::uint64_t id);
  ssize_t inject_notice(write_state& w);
  ssize_t issue_piece(write_state& w, std::uint64_t id, std::uint64_t at, std::uint64_t n,
                      bool final);
  void maybe_finish_write(std::uint64_t id);
  void on_piece_done(op* o, std::error_code ec);
  void op_accepted(node_id peer);
  void op_completed(node_id peer, bool abandoned);
  void note_progress(node_id peer);
  void enqueue(node_id peer, waiting_op w);
  bool must_wait(node_id peer) const;
  void retry_waiting();
  bool retry(waiting_op w);
  void abandon(node_id peer, std::error_code why);
  void give_up_on_stalled_peers();

  event_loop& loop;
  node_id self;
  fabric_options options;
  std::unique_ptr<fabric_link::endpoint> provider;  ///< the libfabric objects
  std::string name_hex;                             ///< our endpoint's name, as addresses carry it
  /// Sees a peer's process end at once: the endpoint has no connection whose end would say so.
  std::shared_ptr<peer_watch> watch;
  std::shared_ptr<fabric_link::progress_driver> progress;
  fabric_link::link_sessions sessions;
  fabric_link::frame_assembly assembly;
  fabric_link::peer_traffic traffic;
  fabric_link::op_pool ops;

  transport_events events;
  bool running = false;
  bool closed = false;
  fabric_stats counters;

  std::unordered_map<node_id, fi_addr_t> peers;
  std::unordered_map<node_id, std::vector<std::byte>> peer_names;  ///< fi_getname blobs
  /// Address entries made to answer a hello from a node not (yet) among `peers`.
  std::unordered_map<node_id, fi_addr_t> temporary;
  std::map<std::uint64_t, region> regions;            // by id
  std::map<const std::byte*, std::uint64_t> by_base;  // region base -> id
  std::uint64_t next_region = 1;
  std::mt19937_64 keys{std::random_device{}()};

  std::unordered_map<std::uint64_t, handshake_out> handshakes;  ///< in flight or waiting, by op id
  std::deque<std::uint64_t> handshakes_waiting;

  std::unique_ptr<std::byte[]> rx_slab;
  fid_mr* rx_mr = nullptr;
  std::vector<op*> rx_ops;
  std::deque<std::uint64_t> rx_waiting;  ///< receive slots the provider refused

  std::unordered_map<std::uint64_t, send_state> sends;
  std::unordered_map<std::uint64_t, write_state> writes;
  std::uint64_t next_op_id = 1;
};

}  // namespace ferry
