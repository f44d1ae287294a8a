#include "transport/tcp/tcp_transport.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <numeric>
#include <thread>

#include "platform/real_environment.hpp"
#include "runtime/actor.hpp"
#include "runtime/messages.hpp"
#include "runtime/node.hpp"
#include "runtime/same_host.hpp"
#include "tcp_test_support.hpp"
#include "transport/errc.hpp"

namespace ferry {
namespace {

/// Answers every ping with a pong carrying the same nonce and payload.
class echo : public actor {
 public:
  echo(node& n, actor_id id) : actor(n, id) {
    on<ping>([this](const envelope_header& h, const ping& p) {
      send(h.from, pong{.nonce = p.nonce, .payload = p.payload});
    });
  }
};

/// Options of scheme "tcp" or "cma" (same-host copies), with the test secret.
tcp_options secret_options(std::string_view scheme = "tcp") {
  tcp_options o;
  o.secret = test::test_secret();
  o.same_host_copy = scheme == "cma";
  return o;
}

/// Two nodes on one loop, linked over loopback TCP; every test runs for "tcp" and for "cma",
/// whose writes between the two nodes are copies inside this process.
struct tcp_pair : ::testing::TestWithParam<std::string> {
  message_registry registry = test::test_registry();
  event_loop loop;
  real_environment env{loop};
  std::shared_ptr<tcp_transport> ta = tcp_transport::make(loop, 1, secret_options(GetParam()));
  std::shared_ptr<tcp_transport> tb = tcp_transport::make(loop, 2, secret_options(GetParam()));
  node a{env, 1, ta, registry};
  node b{env, 2, tb, registry};
  void SetUp() override {
    ASSERT_FALSE(a.start());
    ASSERT_FALSE(b.start());
    ASSERT_FALSE(ta->add_peer(2, tb->local_address()));
    ASSERT_FALSE(tb->add_peer(1, ta->local_address()));
  }
  /// Runs the loop until `done`, or fails the test after 30 s instead of hanging.
  void run_until(const std::function<bool()>& done) {
    auto expired = std::make_shared<bool>(false);
    const auto timer = a.clock().async_wait(std::chrono::seconds(30),
                                            [expired](std::error_code ec) { *expired = !ec; });
    loop.run_until([&] { return done() || *expired; });
    a.clock().cancel(timer);
    ASSERT_FALSE(*expired) << "timed out";
  }
};

TEST_P(tcp_pair, local_address_is_loopback_host_and_port) {
  EXPECT_TRUE(ta->local_address().starts_with("127.0.0.1:"));
  EXPECT_NE(test::port_of(ta->local_address()), 0);
  EXPECT_EQ(ta->scheme(), GetParam());
}

TEST_P(tcp_pair, actors_ping_pong_across_nodes) {
  echo server(b, 1);
  actor client(a, 1);
  std::vector<std::uint64_t> nonces;
  client.on<pong>([&](const envelope_header& h, const pong& p) {
    EXPECT_EQ(h.from, (address{2, 1}));
    EXPECT_EQ(p.payload, "round " + std::to_string(p.nonce));
    nonces.push_back(p.nonce);
    if (p.nonce < 100) {
      client.send(server.self(),
                  ping{.nonce = p.nonce + 1, .payload = "round " + std::to_string(p.nonce + 1)});
    }
  });
  server.start();
  client.start();
  client.send(server.self(), ping{.nonce = 1, .payload = "round 1"});
  run_until([&] { return nonces.size() == 100; });
  std::vector<std::uint64_t> expected(100);
  std::iota(expected.begin(), expected.end(), 1);
  EXPECT_EQ(nonces, expected);
  EXPECT_EQ(b.stats().delivered, 100u);
  EXPECT_EQ(a.stats().delivered, 100u);
  // One link each way, each authenticated once.
  EXPECT_EQ(ta->stats().links_accepted, 1u);
  EXPECT_EQ(tb->stats().links_accepted, 1u);
  EXPECT_EQ(tb->stats().handshakes_failed, 0u);
}

TEST_P(tcp_pair, bulk_write_lands_bytes_and_notifies_both_sides) {
  std::vector<std::byte> source(8 << 20), target(16 << 20);
  test::fill_pattern(source);
  auto local = ta->register_region(source);
  auto remote = tb->register_region(target);
  ASSERT_TRUE(local && remote);

  std::vector<write_notice> seen;
  b.on_write(7, [&](const write_notice& n) { seen.push_back(n); });
  int completions = 0;
  std::error_code result;
  ta->async_write(source, *remote, 4096, make_imm(7, 0xabcdef), [&](std::error_code ec) {
    ++completions;
    result = ec;
  });
  run_until([&] { return completions == 1 && seen.size() == 1; });

  EXPECT_FALSE(result) << result.message();
  EXPECT_EQ(seen[0].from, 1u);
  EXPECT_EQ(seen[0].region, remote->id);
  EXPECT_EQ(seen[0].offset, 4096u);
  EXPECT_EQ(seen[0].length, source.size());
  EXPECT_EQ(seen[0].imm, make_imm(7, 0xabcdef));
  EXPECT_TRUE(std::equal(source.begin(), source.end(), target.begin() + 4096));
  EXPECT_TRUE(std::all_of(target.begin(), target.begin() + 4096,
                          [](std::byte x) { return x == std::byte{0}; }));
  EXPECT_TRUE(std::all_of(target.begin() + 4096 + source.size(), target.end(),
                          [](std::byte x) { return x == std::byte{0}; }));

  // A later round trip on the same links flushes anything late: still exactly one completion.
  echo server(b, 1);
  actor client(a, 1);
  bool answered = false;
  client.on<pong>([&](const envelope_header&, const pong&) { answered = true; });
  server.start();
  client.start();
  client.send(server.self(), ping{.nonce = 1});
  run_until([&] { return answered; });
  EXPECT_EQ(completions, 1);
  EXPECT_EQ(seen.size(), 1u);
}

TEST_P(tcp_pair, bad_writes_are_refused_before_any_byte_lands) {
  std::vector<std::byte> source(4096, std::byte{0x5a}), target(8192);
  auto local = ta->register_region(source);
  auto remote = tb->register_region(target);
  ASSERT_TRUE(local && remote);
  int notices = 0;
  b.on_write(0, [&](const write_notice&) { ++notices; });

  auto write = [&](std::span<const std::byte> from, region_desc to, std::uint64_t offset) {
    int completions = 0;
    std::error_code result;
    ta->async_write(from, to, offset, 0, [&](std::error_code ec) {
      ++completions;
      result = ec;
    });
    run_until([&] { return completions > 0; });
    EXPECT_EQ(completions, 1);
    return result;
  };
  auto wrong_key = *remote;
  wrong_key.key ^= 1;
  auto unknown = *remote;
  unknown.id += 100;
  std::vector<std::byte> unregistered(16);

  EXPECT_EQ(write(source, wrong_key, 0), transport_errc::key_mismatch);
  EXPECT_EQ(write(source, unknown, 0), transport_errc::unknown_region);
  EXPECT_EQ(write(source, *remote, 8192 - 100), transport_errc::out_of_bounds);
  EXPECT_EQ(write(source, *remote, ~std::uint64_t{0} - 10), transport_errc::out_of_bounds);
  EXPECT_EQ(write(unregistered, *remote, 0), transport_errc::not_registered);
  EXPECT_TRUE(
      std::all_of(target.begin(), target.end(), [](std::byte x) { return x == std::byte{0}; }));
  EXPECT_EQ(notices, 0);
  EXPECT_EQ(tb->stats().writes_refused, 4u);

  // The link survived the refusals (their payloads were drained) and still carries writes.
  EXPECT_FALSE(write(source, *remote, 4096));
  EXPECT_TRUE(std::all_of(target.begin() + 4096, target.end(),
                          [](std::byte x) { return x == std::byte{0x5a}; }));
  EXPECT_TRUE(std::all_of(target.begin(), target.begin() + 4096,
                          [](std::byte x) { return x == std::byte{0}; }));
  EXPECT_EQ(notices, 1);
  EXPECT_EQ(tb->stats().protocol_violations, 0u);
  EXPECT_EQ(tb->stats().links_accepted, 1u);
}

TEST_P(tcp_pair, a_rekeyed_region_refuses_the_old_key_and_keeps_the_link) {
  std::vector<std::byte> source(4096, std::byte{0x5a}), target(8192);
  ASSERT_TRUE(ta->register_region(source));
  const auto old_key = tb->register_region(target);
  ASSERT_TRUE(old_key);
  const auto new_key = tb->rekey_region(old_key->id);
  ASSERT_TRUE(new_key);
  EXPECT_EQ(new_key->id, old_key->id);
  auto write = [&](const region_desc& to, std::uint64_t offset) {
    std::optional<std::error_code> result;
    ta->async_write(source, to, offset, 0, [&](std::error_code ec) { result = ec; });
    run_until([&] { return result.has_value(); });
    return result.value_or(std::error_code{});
  };
  EXPECT_EQ(write(*old_key, 0), transport_errc::key_mismatch);
  EXPECT_TRUE(
      std::all_of(target.begin(), target.end(), [](std::byte x) { return x == std::byte{0}; }));
  EXPECT_FALSE(write(*new_key, 4096));
  EXPECT_TRUE(std::all_of(target.begin() + 4096, target.end(),
                          [](std::byte x) { return x == std::byte{0x5a}; }));
  EXPECT_EQ(tb->stats().writes_refused, 1u);
  EXPECT_EQ(tb->stats().links_accepted, 1u);
}

TEST_P(tcp_pair, many_writes_and_frames_interleave) {
  constexpr std::size_t block = 64 << 10, blocks = 64;
  std::vector<std::byte> source(block * blocks), target(block * blocks);
  test::fill_pattern(source);
  auto local = ta->register_region(source);
  auto remote = tb->register_region(target);
  ASSERT_TRUE(local && remote);
  echo server(b, 1);
  actor client(a, 1);
  std::size_t pongs = 0;
  client.on<pong>([&](const envelope_header&, const pong&) { ++pongs; });
  server.start();
  client.start();

  std::vector<int> completions(blocks, 0);
  std::set<std::uint32_t> imms;
  b.on_write(3, [&](const write_notice& n) { imms.insert(imm_value(n.imm)); });
  // Blocks in reverse order, each followed by a ping: acks and frames interleave on the links.
  for (std::size_t i = blocks; i-- > 0;) {
    ta->async_write(std::span(source).subspan(i * block, block), *remote, i * block,
                    make_imm(3, static_cast<std::uint32_t>(i)), [&, i](std::error_code ec) {
                      EXPECT_FALSE(ec) << ec.message();
                      ++completions[i];
                    });
    client.send(server.self(), ping{.nonce = i});
  }
  run_until([&] {
    return pongs == blocks && imms.size() == blocks &&
           std::all_of(completions.begin(), completions.end(), [](int c) { return c > 0; });
  });
  EXPECT_TRUE(std::all_of(completions.begin(), completions.end(), [](int c) { return c == 1; }));
  EXPECT_EQ(test::pattern_mismatches(target), 0u);
}

TEST_P(tcp_pair, unreachable_peer_fails_each_operation_once) {
  // A port nobody listens on: bind one, note it, close it.
  boost::asio::ip::tcp::acceptor probe(loop.io(), {boost::asio::ip::make_address("127.0.0.1"), 0});
  const auto port = probe.local_endpoint().port();
  probe.close();
  ASSERT_FALSE(ta->add_peer(5, "127.0.0.1:" + std::to_string(port)));
  std::vector<std::byte> source(64);
  ASSERT_TRUE(ta->register_region(source));
  int sends = 0, writes = 0;
  std::error_code send_error, write_error;
  ta->async_send(5, encode(envelope_header{.from = {1, 1}, .to = {5, 1}}, ping{}),
                 [&](std::error_code ec) {
                   ++sends;
                   send_error = ec;
                 });
  ta->async_write(source, region_desc{.owner = 5, .id = 1, .length = 64}, 0, 0,
                  [&](std::error_code ec) {
                    ++writes;
                    write_error = ec;
                  });
  run_until([&] { return sends > 0 && writes > 0; });
  EXPECT_EQ(send_error, transport_errc::peer_unreachable);
  EXPECT_EQ(write_error, transport_errc::peer_unreachable);
  // And a node we were never told about.
  int unknown = 0;
  ta->async_send(77, encode(envelope_header{.from = {1, 1}, .to = {77, 1}}, ping{}),
                 [&](std::error_code ec) {
                   ++unknown;
                   EXPECT_EQ(ec, transport_errc::peer_unreachable);
                 });
  run_until([&] { return unknown > 0; });
  EXPECT_EQ(sends, 1);
  EXPECT_EQ(writes, 1);
  EXPECT_EQ(unknown, 1);
}

TEST_P(tcp_pair, lost_peer_fails_pending_write_once_and_next_send_reconnects) {
  // Node 9 is a hand-driven listener: it accepts the write's header, then hangs up.
  boost::asio::io_context raw_io;
  boost::asio::ip::tcp::acceptor listener(raw_io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  ASSERT_FALSE(ta->add_peer(9, "127.0.0.1:" + std::to_string(listener.local_endpoint().port())));
  std::optional<node_id> first_client, second_client;
  std::vector<std::byte> control_body;
  bool raw_done = false;
  const auto write_type =
      GetParam() == "cma" ? tcp_link::frame_type::local_write : tcp_link::frame_type::write;
  std::thread raw([&] {
    {
      test::raw_peer p(listener.accept());
      first_client = p.accept_handshake(9, test::test_secret());
      auto w = p.read_frame();  // the WRITE header; its payload is never read
      if (!w || w->type != write_type) first_client.reset();
      p.close();
    }
    {
      test::raw_peer p(listener.accept());
      second_client = p.accept_handshake(9, test::test_secret());
      if (auto f = p.read_frame(); f && f->type == tcp_link::frame_type::control)
        control_body = f->body;
      p.close();
    }
    loop.post([&] { raw_done = true; });
  });

  std::vector<std::pair<node_id, std::error_code>> lost;
  a.on_peer_lost([&](node_id peer, std::error_code why) { lost.emplace_back(peer, why); });
  std::vector<std::byte> source(4 << 20, std::byte{1});
  ASSERT_TRUE(ta->register_region(source));
  int completions = 0;
  std::error_code result;
  ta->async_write(source, region_desc{.owner = 9, .id = 1, .key = 2, .length = source.size()}, 0, 0,
                  [&](std::error_code ec) {
                    ++completions;
                    result = ec;
                  });
  run_until([&] { return completions > 0 && !lost.empty(); });
  EXPECT_EQ(result, transport_errc::connection_lost);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].first, 9u);

  // The next send makes a fresh link.
  const auto f = encode(envelope_header{.from = {1, 1}, .to = {9, 1}}, ping{.nonce = 42});
  int sent = 0;
  ta->async_send(9, f, [&](std::error_code ec) {
    ++sent;
    EXPECT_FALSE(ec) << ec.message();
  });
  run_until([&] { return raw_done && sent > 0; });
  raw.join();
  EXPECT_EQ(first_client, node_id{1});
  EXPECT_EQ(second_client, node_id{1});
  EXPECT_EQ(control_body, std::vector<std::byte>(f.begin() + frame_prefix_bytes, f.end()));
  EXPECT_EQ(completions, 1);
  EXPECT_EQ(sent, 1);
}

// A write whose header came before the rekey: its payload lands a piece at a time, and the pieces
// begun after the rekey are refused. A peer driven by hand sends the header and the first piece,
// waits for the rekey, then sends the rest.
TEST(tcp_transport, a_write_under_way_stops_landing_once_its_region_is_rekeyed) {
  event_loop loop;
  real_environment env{loop};
  auto receiver = tcp_transport::make(loop, 2, secret_options());
  std::vector<write_notice> notices;
  ASSERT_FALSE(receiver->start({.on_write = [&](const write_notice& n) { notices.push_back(n); }}));
  constexpr std::size_t piece = 4 << 20, length = 3 * piece;
  std::vector<std::byte> target(length + 4096);
  const auto old_key = *receiver->register_region(target);

  std::atomic<bool> rekeyed = false, finished = false;
  std::optional<tcp_link::write_ack> refused, accepted;
  region_desc new_key;
  std::thread writer([&] {
    test::raw_peer p(test::port_of(receiver->local_address()));
    if (!p.handshake(1, 2, test::test_secret())) return finished.store(true);
    const std::vector<std::byte> payload(length, std::byte{0x11});
    p.send(tcp_link::encode(tcp_link::write_header{
        .region = old_key.id, .key = old_key.key, .length = length, .id = 1}));
    p.send(std::span(payload).first(piece));
    // The main thread rekeys once the first piece landed; a test that waits longer has failed.
    for (int waited = 0; !rekeyed; ++waited) {
      if (waited == 30'000) return finished.store(true);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    p.send(std::span(payload).subspan(piece));
    if (auto f = p.read_frame(); f && f->type == tcp_link::frame_type::write_ack)
      refused = tcp_link::parse_write_ack(f->body);
    // The link is still up: a write under the new key lands.
    p.send(tcp_link::encode(tcp_link::write_header{
        .region = new_key.id, .key = new_key.key, .offset = length, .length = 4096, .id = 2}));
    p.send(std::span(payload).first(4096));
    if (auto f = p.read_frame(); f && f->type == tcp_link::frame_type::write_ack)
      accepted = tcp_link::parse_write_ack(f->body);
    finished = true;
  });
  const auto first_piece = std::span(target).first(piece);
  loop.run_until([&] {
    return finished || std::all_of(first_piece.begin(), first_piece.end(),
                                   [](std::byte x) { return x == std::byte{0x11}; });
  });
  // Past the turn that landed the first piece: the second is asked for under the old key.
  test::one_turn(loop);
  new_key = *receiver->rekey_region(old_key.id);
  // The write the old key let in is under way until its refusal.
  bool ended = false;
  EXPECT_TRUE(receiver->when_writes_end(old_key.id, [&] { ended = true; }));
  test::one_turn(loop);
  EXPECT_FALSE(ended);
  rekeyed = true;
  loop.run_until([&] { return finished.load(); });
  writer.join();
  EXPECT_TRUE(ended);

  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->id, 1u);
  EXPECT_EQ(refused->status, static_cast<std::uint16_t>(transport_errc::key_mismatch));
  ASSERT_TRUE(accepted);
  EXPECT_EQ(accepted->id, 2u);
  EXPECT_EQ(accepted->status, 0u);
  // At most the piece already asked for lands after the rekey; the last one does not.
  const auto last_piece = std::span(target).subspan(2 * piece, piece);
  EXPECT_TRUE(std::all_of(last_piece.begin(), last_piece.end(),
                          [](std::byte x) { return x == std::byte{0}; }));
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].offset, length);
  EXPECT_EQ(receiver->stats().writes_refused, 1u);
  receiver->close();
}

/// How a payload under way gets cut short: on the receiver's loop, or by what the writer does next
/// (given the receiver's port).
struct cut_short {
  std::function<void(tcp_transport&, std::uint64_t region)> on_loop;
  std::function<void(std::uint16_t)> by_writer;
};

/// A hand-driven node 1 writes 12 MiB into a region of node 2 and stops after its first 4 MiB
/// piece; then its link is cut short. The rest must never land, and the write must end for
/// `when_writes_end`.
void expect_rest_of_payload_dropped(const cut_short& cut) {
  event_loop loop;
  real_environment env{loop};
  auto receiver = tcp_transport::make(loop, 2, secret_options());
  std::vector<write_notice> notices;
  ASSERT_FALSE(receiver->start({.on_write = [&](const write_notice& n) { notices.push_back(n); }}));
  constexpr std::size_t piece = 4 << 20, length = 3 * piece;
  std::vector<std::byte> target(length);
  const auto region = *receiver->register_region(target);
  const auto port = test::port_of(receiver->local_address());

  std::atomic<bool> go = false, finished = false, closed = false;
  std::thread writer([&] {
    // The link is closed by then: the loop may have nothing left to wake it.
    auto finish = [&] { finished = true, loop.post([] {}); };
    test::raw_peer p(port);
    if (!p.handshake(1, 2, test::test_secret())) return finish();
    const std::vector<std::byte> payload(length, std::byte{0x11});
    p.send(tcp_link::encode(
        tcp_link::write_header{.region = region.id, .key = region.key, .length = length, .id = 1}));
    p.send(std::span(payload).first(piece));
    // The main thread says go once the first piece landed; a test that waits longer has failed.
    for (int waited = 0; !go; ++waited) {
      if (waited == 30'000) return finish();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (cut.by_writer) cut.by_writer(port);
    p.send(std::span(payload).subspan(piece));  // into a closed link: may fail
    closed = p.closed_by_peer();
    finish();
  });
  const auto first_piece = std::span(target).first(piece);
  loop.run_until([&] {
    return finished || std::all_of(first_piece.begin(), first_piece.end(),
                                   [](std::byte x) { return x == std::byte{0x11}; });
  });
  bool ended = false;
  EXPECT_TRUE(receiver->when_writes_end(region.id, [&] { ended = true; }));
  if (cut.on_loop) cut.on_loop(*receiver, region.id);
  go = true;
  loop.run_until([&] { return finished.load(); });
  writer.join();
  test::one_turn(loop);  // what the write's end posted

  EXPECT_TRUE(closed);
  EXPECT_TRUE(ended);
  const auto rest = std::span(target).subspan(piece);
  EXPECT_TRUE(std::all_of(rest.begin(), rest.end(), [](std::byte x) { return x == std::byte{0}; }));
  EXPECT_TRUE(std::none_of(notices.begin(), notices.end(),
                           [](const write_notice& n) { return n.length == length; }));
  receiver->close();
}

// A member removes the links of members a new plan dropped (`job_member::link_to`).
TEST(tcp_transport, a_write_under_way_stops_landing_once_its_sender_is_removed) {
  expect_rest_of_payload_dropped(
      {.on_loop = [](tcp_transport& t, std::uint64_t) { t.remove_peer(1); }});
}

// Its owner may free a region's memory once it deregistered it (a worker's destructor does).
TEST(tcp_transport, a_write_under_way_stops_landing_once_its_region_is_deregistered) {
  expect_rest_of_payload_dropped(
      {.on_loop = [](tcp_transport& t, std::uint64_t region) { t.deregister_region(region); }});
}

// A node that comes back on a new link (its process replaced, or its end of the old link broken)
// never finishes what the old link was reading.
TEST(tcp_transport, a_newer_link_from_the_node_ends_a_payload_its_older_one_was_reading) {
  expect_rest_of_payload_dropped({.by_writer = [](std::uint16_t port) {
    test::raw_peer again(port);
    ASSERT_TRUE(again.handshake(1, 2, test::test_secret()));
    // A write over the new link: read only once the link is ready, after the old one was dropped.
    ASSERT_TRUE(again.send(
        tcp_link::encode(tcp_link::write_header{.region = 1, .key = 0, .length = 0, .id = 7})));
    const auto ack = again.read_frame();
    ASSERT_TRUE(ack && ack->type == tcp_link::frame_type::write_ack);
  }});
}

INSTANTIATE_TEST_SUITE_P(schemes, tcp_pair, ::testing::Values("tcp", "cma"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(tcp_transport_config, start_needs_a_secret_or_explicit_unauthenticated_mode) {
  event_loop loop;
  real_environment env{loop};
  auto plain = tcp_transport::make(loop, 1, {});
  EXPECT_EQ(plain->start({}), transport_errc::unauthenticated);
  tcp_options short_secret;
  short_secret.secret = job_secret(8, std::byte{1});
  EXPECT_EQ(tcp_transport::make(loop, 2, short_secret)->start({}), errc::invalid_argument);
  tcp_options open;
  open.allow_unauthenticated = true;
  EXPECT_FALSE(tcp_transport::make(loop, 3, open)->start({}));
  tcp_options bad_host = secret_options();
  bad_host.bind_host = "not an address";
  EXPECT_EQ(tcp_transport::make(loop, 4, bad_host)->start({}), transport_errc::bad_address);
}

TEST(tcp_transport_config, peer_addresses_are_parsed_strictly) {
  event_loop loop;
  real_environment env{loop};
  auto t = tcp_transport::make(loop, 1, secret_options());
  EXPECT_FALSE(t->add_peer(2, "127.0.0.1:4000"));
  EXPECT_FALSE(t->add_peer(3, "[::1]:4000"));
  EXPECT_FALSE(t->add_peer(4, "localhost:4000"));
  for (const char* bad : {"", "127.0.0.1", ":4000", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:65536",
                          "127.0.0.1:40x", "[::1:4000", "[]:4000"}) {
    EXPECT_EQ(t->add_peer(5, bad), transport_errc::bad_address) << bad;
  }
}

/// Runs `loop` until `done`; false after 30 s instead of hanging.
bool run_until(event_loop& loop, const std::function<bool()>& done) {
  auto expired = std::make_shared<bool>(false);
  boost::asio::steady_timer timer(loop.io(), std::chrono::seconds(30));
  timer.async_wait([expired](const boost::system::error_code& ec) { *expired = !ec; });
  loop.run_until([&] { return done() || *expired; });
  return !*expired;
}

TEST(cma_links, a_cma_writer_and_a_tcp_receiver_do_not_mix) {
  message_registry registry = test::test_registry();
  event_loop loop;
  real_environment env{loop};
  auto ta = tcp_transport::make(loop, 1, secret_options("cma"));
  auto tb = tcp_transport::make(loop, 2, secret_options("tcp"));
  node a{env, 1, ta, registry}, b{env, 2, tb, registry};
  ASSERT_FALSE(a.start());
  ASSERT_FALSE(b.start());
  ASSERT_FALSE(ta->add_peer(2, tb->local_address()));
  std::vector<std::byte> source(4096, std::byte{1}), target(4096);
  ASSERT_TRUE(ta->register_region(source));
  const auto remote = tb->register_region(target);
  ASSERT_TRUE(remote);
  int completions = 0;
  std::error_code result;
  ta->async_write(source, *remote, 0, 0, [&](std::error_code ec) {
    ++completions;
    result = ec;
  });
  ASSERT_TRUE(run_until(loop, [&] { return completions > 0; }));
  // The tcp node drops the link that brought a LOCAL_WRITE; the writer sees it go.
  EXPECT_EQ(result, transport_errc::connection_lost);
  EXPECT_EQ(tb->stats().protocol_violations, 1u);
  EXPECT_TRUE(
      std::all_of(target.begin(), target.end(), [](std::byte x) { return x == std::byte{0}; }));
}

TEST(cma_links, failed_copies_are_acked_with_their_error_and_the_link_stays) {
  message_registry registry = test::test_registry();
  event_loop loop;
  real_environment env{loop};
  auto tb = tcp_transport::make(loop, 2, secret_options("cma"));
  node b{env, 2, tb, registry};
  ASSERT_FALSE(b.start());
  std::vector<std::byte> target(1 << 20);
  const auto region = *tb->register_region(target);
  std::vector<std::byte> source(64 << 10);
  test::fill_pattern(source);
  std::vector<write_notice> landed;
  b.on_write(0, [&](const write_notice& n) { landed.push_back(n); });

  const pid_t gone = ::fork();  // a process that exited: its pid names nobody
  ASSERT_GE(gone, 0);
  if (gone == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  // A page nothing may read (a page unmapped here could be mapped again by the time it is read).
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  void* hole = ::mmap(nullptr, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(hole, MAP_FAILED);

  // A hand-driven writer: node 1 on a raw socket, naming sources in this process.
  const auto here = static_cast<std::uint32_t>(::getpid());
  const auto host = same_host_tag();
  auto address = [](const void* p) {
    return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p));
  };
  std::vector<std::optional<std::uint16_t>> statuses;
  bool raw_done = false;
  std::thread raw([&] {
    test::raw_peer p(test::port_of(tb->local_address()));
    if (p.handshake(1, 2, test::test_secret())) {
      std::uint64_t id = 0;
      auto write = [&](std::uint32_t pid, std::uint64_t from,
                       std::uint64_t tag) -> std::optional<std::uint16_t> {
        const tcp_link::local_write_header h{.write = {.region = region.id,
                                                       .key = region.key,
                                                       .offset = 0,
                                                       .length = source.size(),
                                                       .imm = 0,
                                                       .id = ++id},
                                             .pid = pid,
                                             .source = from,
                                             .host = tag};
        if (!p.send(tcp_link::encode(h))) return std::nullopt;
        const auto f = p.read_frame();
        if (!f || f->type != tcp_link::frame_type::write_ack) return std::nullopt;
        const auto ack = tcp_link::parse_write_ack(f->body);
        if (!ack || ack->id != id) return std::nullopt;
        return ack->status;
      };
      statuses.push_back(write(here, address(hole), host));  // EFAULT
      statuses.push_back(
          write(static_cast<std::uint32_t>(gone), address(source.data()), host));  // ESRCH
      statuses.push_back(write(here, address(source.data()), host ^ 1));           // another host
      statuses.push_back(write(here, address(source.data()), host));               // lands
    }
    loop.post([&] { raw_done = true; });
  });
  const bool finished = run_until(loop, [&] { return raw_done && !landed.empty(); });
  raw.join();
  ::munmap(hole, page);
  ASSERT_TRUE(finished);

  const auto failed = static_cast<std::uint16_t>(transport_errc::copy_failed);
  const auto elsewhere = static_cast<std::uint16_t>(transport_errc::not_same_host);
  const std::vector<std::optional<std::uint16_t>> expected{failed, failed, elsewhere,
                                                           std::uint16_t{0}};
  EXPECT_EQ(statuses, expected);
  EXPECT_EQ(tb->stats().copies_failed, 3u);
  EXPECT_EQ(tb->stats().protocol_violations, 0u);
  ASSERT_EQ(landed.size(), 1u);
  EXPECT_EQ(landed[0].from, 1u);
  EXPECT_EQ(landed[0].length, source.size());
  EXPECT_EQ(test::pattern_mismatches(std::span(target).first(source.size())), 0u);
  EXPECT_TRUE(std::all_of(target.begin() + static_cast<std::ptrdiff_t>(source.size()), target.end(),
                          [](std::byte x) { return x == std::byte{0}; }));
}

TEST(cma_links, past_max_copies_per_link_the_link_waits_and_every_write_lands) {
  message_registry registry = test::test_registry();
  event_loop loop;
  real_environment env{loop};
  auto receiver_options = secret_options("cma");
  receiver_options.max_copies_per_link = 2;
  auto ta = tcp_transport::make(loop, 1, secret_options("cma"));
  auto tb = tcp_transport::make(loop, 2, receiver_options);
  node a{env, 1, ta, registry}, b{env, 2, tb, registry};
  ASSERT_FALSE(a.start());
  ASSERT_FALSE(b.start());
  ASSERT_FALSE(ta->add_peer(2, tb->local_address()));
  constexpr std::size_t block = 64 << 10, blocks = 48;
  std::vector<std::byte> source(block * blocks), target(source.size());
  test::fill_pattern(source);
  ASSERT_TRUE(ta->register_region(source));
  const auto remote = *tb->register_region(target);
  std::set<std::uint32_t> imms;
  b.on_write(5, [&](const write_notice& n) { imms.insert(imm_value(n.imm)); });
  std::vector<int> completions(blocks, 0);
  for (std::size_t i = 0; i < blocks; ++i) {
    ta->async_write(std::span<const std::byte>(source).subspan(i * block, block), remote, i * block,
                    make_imm(5, static_cast<std::uint32_t>(i)), [&, i](std::error_code ec) {
                      EXPECT_FALSE(ec) << ec.message();
                      ++completions[i];
                    });
  }
  ASSERT_TRUE(run_until(loop, [&] {
    return imms.size() == blocks &&
           std::all_of(completions.begin(), completions.end(), [](int c) { return c > 0; });
  }));
  EXPECT_TRUE(std::all_of(completions.begin(), completions.end(), [](int c) { return c == 1; }));
  EXPECT_EQ(test::pattern_mismatches(target), 0u);
}

TEST(cma_links, close_stops_copies_and_every_write_completes_once) {
  message_registry registry = test::test_registry();
  event_loop loop;
  real_environment env{loop};
  auto ta = tcp_transport::make(loop, 1, secret_options("cma"));
  auto tb = tcp_transport::make(loop, 2, secret_options("cma"));
  node a{env, 1, ta, registry}, b{env, 2, tb, registry};
  ASSERT_FALSE(a.start());
  ASSERT_FALSE(b.start());
  ASSERT_FALSE(ta->add_peer(2, tb->local_address()));
  constexpr std::size_t block = std::size_t{32} << 20, blocks = 8;
  std::vector<std::byte> source(block * blocks, std::byte{0x33}), target(source.size());
  ASSERT_TRUE(ta->register_region(source));
  const auto remote = *tb->register_region(target);
  int notices = 0;
  b.on_write(0, [&](const write_notice&) { ++notices; });
  std::vector<int> completions(blocks, 0);
  std::size_t succeeded = 0;
  for (std::size_t i = 0; i < blocks; ++i) {
    ta->async_write(std::span<const std::byte>(source).subspan(i * block, block), remote, i * block,
                    0, [&, i](std::error_code ec) {
                      ++completions[i];
                      if (!ec) ++succeeded;
                    });
  }
  // Close the receiver as soon as the first write landed: the others are copying or queued.
  ASSERT_TRUE(run_until(loop, [&] { return notices > 0; }));
  tb->close();
  const std::vector<std::byte> after_close = target;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a copy still running would show
  EXPECT_TRUE(target == after_close) << "bytes landed after close returned";
  ASSERT_TRUE(run_until(loop, [&] {
    return std::all_of(completions.begin(), completions.end(), [](int c) { return c > 0; });
  }));
  EXPECT_TRUE(std::all_of(completions.begin(), completions.end(), [](int c) { return c == 1; }));
  EXPECT_GE(succeeded, 1u);
  EXPECT_LE(static_cast<int>(succeeded), notices);  // an ack may have been cut off by close
}

TEST(cma_links, deregistering_a_region_stops_its_copies_and_the_link_stays) {
  message_registry registry = test::test_registry();
  event_loop loop;
  real_environment env{loop};
  auto receiver_options = secret_options("cma");
  receiver_options.copy_threads = 1;  // one piece at a time: most are still queued
  auto ta = tcp_transport::make(loop, 1, secret_options("cma"));
  auto tb = tcp_transport::make(loop, 2, receiver_options);
  node a{env, 1, ta, registry}, b{env, 2, tb, registry};
  ASSERT_FALSE(a.start());
  ASSERT_FALSE(b.start());
  ASSERT_FALSE(ta->add_peer(2, tb->local_address()));
  constexpr std::size_t block = std::size_t{64} << 20, blocks = 6;
  std::vector<std::byte> source(block * blocks, std::byte{0x33}), target(source.size());
  ASSERT_TRUE(ta->register_region(source));
  const auto remote = *tb->register_region(target);
  std::vector<int> completions(blocks, 0);
  std::size_t succeeded = 0;
  for (std::size_t i = 0; i < blocks; ++i) {
    ta->async_write(std::span<const std::byte>(source).subspan(i * block, block), remote, i * block,
                    0, [&, i](std::error_code ec) {
                      ++completions[i];
                      if (!ec) ++succeeded;
                    });
  }
  // Deregister as soon as the receiver copies: its owner may free the memory once that returns.
  ASSERT_TRUE(run_until(loop, [&] { return tb->when_writes_end(remote.id, [] {}); }));
  tb->deregister_region(remote.id);
  const std::vector<std::byte> after = target;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a copy still running would show
  EXPECT_TRUE(target == after) << "bytes landed after deregister_region returned";
  ASSERT_TRUE(run_until(loop, [&] {
    return std::all_of(completions.begin(), completions.end(), [](int c) { return c > 0; });
  }));
  EXPECT_TRUE(std::all_of(completions.begin(), completions.end(), [](int c) { return c == 1; }));
  EXPECT_LT(succeeded, blocks);
  // The link stays: a write into another region lands.
  std::vector<std::byte> other(4096);
  const auto fresh = *tb->register_region(other);
  std::error_code last = transport_errc::connection_lost;
  bool landed = false;
  ta->async_write(std::span<const std::byte>(source).first(other.size()), fresh, 0, 0,
                  [&](std::error_code ec) { last = ec, landed = true; });
  ASSERT_TRUE(run_until(loop, [&] { return landed; }));
  EXPECT_FALSE(last) << last.message();
  EXPECT_TRUE(
      std::all_of(other.begin(), other.end(), [](std::byte x) { return x == std::byte{0x33}; }));
}

}  // namespace
}  // namespace ferry
