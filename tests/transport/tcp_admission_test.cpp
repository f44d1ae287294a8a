/// Floods of idle connections against a real tcp listener (issue 15): one address gets only its
/// share of the handshake budget, idle connections make room for newcomers, and a peer holding
/// the job secret always gets in.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <thread>

#include "platform/real_environment.hpp"
#include "runtime/node.hpp"
#include "tcp_test_support.hpp"
#include "transport/errc.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace ferry {
namespace {

namespace asio = boost::asio;
using test::raw_peer;

/// What an idle connection saw once the flood was over.
enum class fate { open, refused, closed };

/// Idle connections from one source address, opened from a thread of their own.
struct idle_connections {
  asio::io_context io;
  std::vector<asio::ip::tcp::socket> sockets;

  void open(const std::string& source, std::uint16_t port, int count) {
    for (int i = 0; i < count; ++i) {
      auto& s = sockets.emplace_back(io);
      s.open(asio::ip::tcp::v4());
      s.bind({asio::ip::make_address(source), 0});
      s.connect({asio::ip::make_address("127.0.0.1"), port});
    }
  }
  /// Whether each connection is still open, got REFUSE(limit_exceeded) and a close, or was
  /// closed some other way. Call once the listener has done what it does: nothing waits here.
  std::vector<fate> fates() {
    std::vector<fate> out;
    for (auto& s : sockets) {
      std::array<std::byte, tcp_link::head_bytes + tcp_link::refuse_bytes + 1> f{};
      const auto n = ::recv(s.native_handle(), f.data(), f.size(), MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        out.push_back(fate::open);
        continue;
      }
      const auto body = std::span(f).subspan(tcp_link::head_bytes, tcp_link::refuse_bytes);
      const auto reason = tcp_link::parse_refuse(body);
      const bool refused = n == static_cast<ssize_t>(f.size() - 1) && f[4] == std::byte{5} &&
                           reason &&
                           *reason == static_cast<std::uint16_t>(transport_errc::limit_exceeded);
      const auto rest = ::recv(s.native_handle(), f.data(), 1, MSG_DONTWAIT);
      out.push_back(refused && rest == 0 ? fate::refused : fate::closed);
    }
    return out;
  }
};

struct tcp_admission : ::testing::Test {
  message_registry registry = test::test_registry();
  event_loop loop;
  real_environment env{loop};
  std::shared_ptr<tcp_transport> server = [this] {
    tcp_options o;
    o.secret = test::test_secret('s');
    o.handshake_timeout = std::chrono::seconds(20);  // the flood stays unless we close it
    return tcp_transport::make(loop, 2, o);
  }();
  node b{env, 2, server, registry};
  std::vector<std::byte> target = std::vector<std::byte>(4096);
  region_desc region;
  std::uint16_t port = 0;
  /// `connections_evicted`, for threads other than the loop's.
  std::atomic<std::uint64_t> evicted{0};

  void SetUp() override {
    ASSERT_FALSE(b.start());
    region = *server->register_region(target);
    port = test::port_of(server->local_address());
  }
  void run_until(const std::function<bool()>& done) {
    auto expired = std::make_shared<bool>(false);
    const auto timer = b.clock().async_wait(std::chrono::seconds(30),
                                            [expired](std::error_code ec) { *expired = !ec; });
    loop.run_until([&] {
      evicted = server->stats().connections_evicted;
      return done() || *expired;
    });
    b.clock().cancel(timer);
    ASSERT_FALSE(*expired) << "timed out";
  }
  /// A peer with the secret on 127.0.0.1 writes 1 KiB and sends a frame; their errors.
  std::pair<std::error_code, std::error_code> good_peer_writes(node_id id) {
    tcp_options o;
    o.secret = test::test_secret('s');
    auto t = tcp_transport::make(loop, id, o);
    EXPECT_FALSE(t->start({}));
    EXPECT_FALSE(t->add_peer(2, server->local_address()));
    std::vector<std::byte> source(1024, std::byte{0x5a});
    EXPECT_TRUE(t->register_region(source));
    int done = 0;
    std::error_code write_error, send_error;
    t->async_write(source, region, 0, 0, [&](std::error_code ec) {
      ++done;
      write_error = ec;
    });
    t->async_send(2, encode(envelope_header{.from = {id, 1}, .to = {2, 1}}, ping{}),
                  [&](std::error_code ec) {
                    ++done;
                    send_error = ec;
                  });
    run_until([&] { return done == 2; });
    t->close();
    return {write_error, send_error};
  }
  /// Runs `flood` on a thread while the loop serves, until it returns.
  void while_serving(const std::function<void()>& flood) {
    std::atomic<bool> finished = false;
    std::thread t([&] {
      flood();
      finished = true;
      loop.post([] {});
    });
    run_until([&] { return finished.load(); });
    t.join();
  }
};

TEST_F(tcp_admission, idle_flood_from_one_address_keeps_only_its_share) {
  idle_connections flood;
  while_serving([&] { flood.open("127.0.0.2", port, 40); });
  // The newest 8 of the address hold its share; each newcomer past it closed the oldest.
  run_until([&] { return server->stats().connections_evicted == 32; });
  const auto [write_error, send_error] = good_peer_writes(1);
  EXPECT_FALSE(write_error) << write_error.message();
  EXPECT_FALSE(send_error) << send_error.message();
  EXPECT_EQ(target[0], std::byte{0x5a});
  std::vector<fate> fates;
  while_serving([&] { fates = flood.fates(); });
  ASSERT_EQ(fates.size(), 40u);
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(fates[i], i < 32 ? fate::refused : fate::open) << "connection " << i;
  }
  EXPECT_EQ(server->stats().connections_evicted, 32u);
  EXPECT_EQ(server->stats().connections_refused, 0u);
  EXPECT_EQ(server->stats().handshakes_failed, 0u);
  EXPECT_EQ(server->stats().links_accepted, 1u);
}

TEST_F(tcp_admission, idle_flood_from_many_addresses_still_lets_a_peer_in) {
  std::vector<idle_connections> flood(8);
  while_serving([&] {
    for (int a = 0; a < 8; ++a) flood[a].open("127.0.0." + std::to_string(a + 2), port, 10);
  });
  // 80 idle connections for 32 places, at most 8 an address: at least 48 were closed.
  run_until([&] { return server->stats().connections_evicted >= 48; });
  for (const node_id id : {1, 3, 4}) {
    const auto [write_error, send_error] = good_peer_writes(id);
    EXPECT_FALSE(write_error) << write_error.message();
    EXPECT_FALSE(send_error) << send_error.message();
  }
  EXPECT_EQ(server->stats().links_accepted, 3u);
  EXPECT_EQ(server->stats().connections_refused, 0u);
  std::size_t open = 0;
  while_serving([&] {
    for (auto& f : flood) {
      const auto fates = f.fates();
      open += std::count(fates.begin(), fates.end(), fate::open);
      EXPECT_LE(std::count(fates.begin(), fates.end(), fate::open), 8);
      EXPECT_EQ(std::count(fates.begin(), fates.end(), fate::closed), 0);
    }
  });
  EXPECT_LE(open, 32u);
  EXPECT_EQ(open + server->stats().connections_evicted, 80u);
}

TEST_F(tcp_admission, a_handshake_in_progress_survives_a_flood_from_its_own_address) {
  std::optional<raw_peer> peer;
  bool accepted = false;
  while_serving([&] {
    // The real peer sends HELLO and reads CHALLENGE; then the flood, from 127.0.0.1 too.
    peer.emplace(port);
    const auto nonce = make_link_nonce();
    peer->send(tcp_link::encode(tcp_link::hello{tcp_link::auth_mode::hmac_sha256, 7, 2, nonce}));
    auto c = peer->read_frame();
    const auto ch = c ? tcp_link::parse_challenge(c->body) : std::nullopt;
    if (!ch) return;
    idle_connections flood;
    flood.open("127.0.0.1", port, 40);
    // Wait until the listener took them all in: 40 less the 7 places beside ours were closed.
    for (int i = 0; i < 500 && evicted < 33; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    peer->send(tcp_link::encode_proof(
        make_link_proof(test::test_secret('s'), link_role::client, nonce, ch->nonce, 7, 2)));
    auto a = peer->read_frame();
    accepted = a && a->type == tcp_link::frame_type::accept;
  });
  EXPECT_TRUE(accepted);
  EXPECT_EQ(server->stats().connections_evicted, 33u);
  EXPECT_EQ(server->stats().links_accepted, 1u);
}

}  // namespace
}  // namespace ferry
