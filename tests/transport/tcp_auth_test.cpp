#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "platform/real_environment.hpp"
#include "runtime/actor.hpp"
#include "runtime/node.hpp"
#include "tcp_test_support.hpp"
#include "transport/errc.hpp"
#include "transport/link_auth.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace ferry {
namespace {

using test::raw_peer;

/// Node 2 serves with the job secret; tests bring clients with the right, a wrong, or no secret.
struct tcp_auth : ::testing::Test {
  message_registry registry = test::test_registry();
  event_loop loop;
  real_environment env{loop};
  tcp_options server_options() {
    tcp_options o;
    o.secret = test::test_secret('s');
    o.handshake_timeout = std::chrono::milliseconds(300);
    o.max_unauthenticated = 1;
    o.max_links_per_node = 1;
    return o;
  }
  std::shared_ptr<tcp_transport> server = tcp_transport::make(loop, 2, server_options());
  node b{env, 2, server, registry};
  std::vector<std::byte> target = std::vector<std::byte>(4096);
  region_desc region;

  void SetUp() override {
    ASSERT_FALSE(b.start());
    region = *server->register_region(target);
  }
  std::shared_ptr<tcp_transport> client(node_id id, job_secret secret,
                                        bool allow_unauthenticated = false) {
    tcp_options o;
    o.secret = std::move(secret);
    o.allow_unauthenticated = allow_unauthenticated;
    auto t = tcp_transport::make(loop, id, o);
    EXPECT_FALSE(t->start({}));
    EXPECT_FALSE(t->add_peer(2, server->local_address()));
    return t;
  }
  void run_until(const std::function<bool()>& done) {
    auto expired = std::make_shared<bool>(false);
    const auto timer = b.clock().async_wait(std::chrono::seconds(30),
                                            [expired](std::error_code ec) { *expired = !ec; });
    loop.run_until([&] { return done() || *expired; });
    b.clock().cancel(timer);
    ASSERT_FALSE(*expired) << "timed out";
  }
  /// One write and one control frame from `t`; their errors.
  std::pair<std::error_code, std::error_code> try_write_and_send(tcp_transport& t) {
    std::vector<std::byte> source(1024, std::byte{0x77});
    EXPECT_TRUE(t.register_region(source));
    int done = 0;
    std::error_code write_error, send_error;
    t.async_write(source, region, 0, 0, [&](std::error_code ec) {
      ++done;
      write_error = ec;
    });
    t.async_send(2, encode(envelope_header{.from = {t.self(), 1}, .to = {2, 1}}, ping{}),
                 [&](std::error_code ec) {
                   ++done;
                   send_error = ec;
                 });
    run_until([&] { return done == 2; });
    return {write_error, send_error};
  }
  bool target_untouched() const {
    return std::all_of(target.begin(), target.end(), [](std::byte x) { return x == std::byte{0}; });
  }
};

TEST_F(tcp_auth, peer_with_the_right_secret_writes) {
  auto good = client(1, test::test_secret('s'));
  const auto [write_error, send_error] = try_write_and_send(*good);
  EXPECT_FALSE(write_error) << write_error.message();
  EXPECT_FALSE(send_error) << send_error.message();
  EXPECT_TRUE(std::all_of(target.begin(), target.begin() + 1024,
                          [](std::byte x) { return x == std::byte{0x77}; }));
  EXPECT_EQ(server->stats().links_accepted, 1u);
  EXPECT_EQ(server->stats().handshakes_failed, 0u);
}

/// The nodes of a job on one host all connect from one address: links that proved the secret do
/// not count against max_connections_per_address (with a cap of 1, the second node was refused).
TEST(tcp_admission_cap, proven_links_do_not_count_against_the_per_address_cap) {
  event_loop loop;
  real_environment env{loop};
  message_registry registry = test::test_registry();
  tcp_options o;
  o.secret = test::test_secret('s');
  o.max_connections_per_address = 1;
  auto server = tcp_transport::make(loop, 2, o);
  node b{env, 2, server, registry};
  ASSERT_FALSE(b.start());
  int pings = 0;
  struct counter : actor {
    counter(node& n, int& pings) : actor(n, 1) {
      on<ping>([&pings](const envelope_header&, const ping&) { ++pings; });
      start();
    }
  } receiver(b, pings);
  std::vector<std::shared_ptr<tcp_transport>> clients;
  for (node_id id = 10; id < 14; ++id) {
    tcp_options c;
    c.secret = test::test_secret('s');
    clients.push_back(tcp_transport::make(loop, id, c));
    ASSERT_FALSE(clients.back()->start({}));
    ASSERT_FALSE(clients.back()->add_peer(2, server->local_address()));
    // One at a time: the next connects once this one's link is proven.
    std::optional<std::error_code> sent;
    clients.back()->async_send(2, encode(envelope_header{.from = {id, 1}, .to = {2, 1}}, ping{}),
                               [&](std::error_code ec) { sent = ec; });
    loop.run_until(
        [&] { return sent.has_value() && (*sent || pings == static_cast<int>(id - 9)); });
    EXPECT_FALSE(*sent) << "node " << id << ": " << sent->message();
  }
  EXPECT_EQ(pings, 4);
  EXPECT_EQ(server->stats().links_accepted, 4u);
  EXPECT_EQ(server->stats().connections_refused, 0u);
  for (auto& c : clients) c->close();
  b.close();
}

TEST_F(tcp_auth, peer_with_a_wrong_secret_is_refused_and_cannot_write) {
  auto wrong = client(3, test::test_secret('w'));
  const auto [write_error, send_error] = try_write_and_send(*wrong);
  EXPECT_EQ(write_error, transport_errc::unauthenticated);
  EXPECT_EQ(send_error, transport_errc::unauthenticated);
  EXPECT_TRUE(target_untouched());
  run_until([&] { return server->stats().handshakes_failed >= 1; });
  EXPECT_EQ(server->stats().links_accepted, 0u);
  EXPECT_EQ(b.stats().frames_in, 0u);
  EXPECT_EQ(b.stats().writes_in, 0u);
  EXPECT_GE(wrong->stats().handshakes_failed, 1u);

  // A peer with the right secret is served right after.
  auto good = client(1, test::test_secret('s'));
  EXPECT_FALSE(try_write_and_send(*good).first);
  EXPECT_FALSE(target_untouched());
}

TEST_F(tcp_auth, peer_without_a_secret_is_refused) {
  auto open = client(3, {}, true);
  const auto [write_error, send_error] = try_write_and_send(*open);
  EXPECT_EQ(write_error, transport_errc::unauthenticated);
  EXPECT_EQ(send_error, transport_errc::unauthenticated);
  EXPECT_TRUE(target_untouched());
  run_until([&] { return server->stats().handshakes_failed >= 1; });
  EXPECT_EQ(server->stats().links_accepted, 0u);
}

TEST_F(tcp_auth, forged_proof_is_refused_and_pipelined_write_never_lands) {
  const auto port = test::port_of(server->local_address());
  bool refused = false, closed = false;
  bool finished = false;
  std::thread raw([&] {
    raw_peer p(port);
    const auto nonce = make_link_nonce();
    p.send(tcp_link::encode(tcp_link::hello{tcp_link::auth_mode::hmac_sha256, 1, 2, nonce}));
    auto c = p.read_frame();
    if (c && c->type == tcp_link::frame_type::challenge) {
      // A guessed proof, and a write sent before the answer, hoping it slips through.
      std::vector<std::byte> burst = tcp_link::encode_proof(link_proof{});
      const auto w = tcp_link::encode(tcp_link::write_header{
          .region = region.id, .key = region.key, .offset = 0, .length = 16, .imm = 0, .id = 1});
      burst.insert(burst.end(), w.begin(), w.end());
      burst.insert(burst.end(), 16, std::byte{0xee});
      p.send(burst);
      std::vector<raw_peer::link_frame> seen;
      closed = p.closed_by_peer(&seen);
      refused = seen.size() == 1 && seen[0].type == tcp_link::frame_type::refuse &&
                tcp_link::parse_refuse(seen[0].body) ==
                    static_cast<std::uint16_t>(transport_errc::unauthenticated);
    }
    loop.post([&] { finished = true; });
  });
  run_until([&] { return finished; });
  raw.join();
  EXPECT_TRUE(refused);
  EXPECT_TRUE(closed);
  EXPECT_TRUE(target_untouched());
  EXPECT_EQ(server->stats().handshakes_failed, 1u);
  EXPECT_EQ(b.stats().writes_in, 0u);
}

TEST_F(tcp_auth, silent_connection_times_out) {
  const auto port = test::port_of(server->local_address());
  bool closed = false, finished = false;
  std::thread raw([&] {
    raw_peer p(port);
    closed = p.closed_by_peer();
    loop.post([&] { finished = true; });
  });
  run_until([&] { return finished; });
  raw.join();
  EXPECT_TRUE(closed);
  EXPECT_EQ(server->stats().handshakes_failed, 1u);
}

TEST_F(tcp_auth, unauthenticated_connections_are_capped) {
  const auto port = test::port_of(server->local_address());
  bool second_refused = false, finished = false;
  std::thread raw([&] {
    raw_peer first(port);
    // Once the first is in its handshake, the second exceeds max_unauthenticated = 1.
    first.send(tcp_link::encode(
        tcp_link::hello{tcp_link::auth_mode::hmac_sha256, 5, 2, make_link_nonce()}));
    if (auto c = first.read_frame(); c && c->type == tcp_link::frame_type::challenge) {
      raw_peer second(port);
      second.send(tcp_link::encode(
          tcp_link::hello{tcp_link::auth_mode::hmac_sha256, 6, 2, make_link_nonce()}));
      auto f = second.read_frame();
      second_refused = f && f->type == tcp_link::frame_type::refuse &&
                       tcp_link::parse_refuse(f->body) ==
                           static_cast<std::uint16_t>(transport_errc::limit_exceeded);
    }
    loop.post([&] { finished = true; });
  });
  run_until([&] { return finished; });
  raw.join();
  EXPECT_TRUE(second_refused);
  EXPECT_EQ(server->stats().connections_refused, 1u);
}

TEST_F(tcp_auth, links_per_node_are_capped) {
  auto good = client(1, test::test_secret('s'));
  ASSERT_FALSE(try_write_and_send(*good).first);
  const auto port = test::port_of(server->local_address());
  bool accepted = true, refused = false, finished = false;
  std::thread raw([&] {
    // A second link claiming node 1, with the right secret: over max_links_per_node = 1.
    raw_peer p(port);
    const auto nonce = make_link_nonce();
    p.send(tcp_link::encode(tcp_link::hello{tcp_link::auth_mode::hmac_sha256, 1, 2, nonce}));
    auto c = p.read_frame();
    const auto ch = c ? tcp_link::parse_challenge(c->body) : std::nullopt;
    if (ch) {
      p.send(tcp_link::encode_proof(
          make_link_proof(test::test_secret('s'), link_role::client, nonce, ch->nonce, 1, 2)));
      auto f = p.read_frame();
      accepted = f && f->type == tcp_link::frame_type::accept;
      refused = f && f->type == tcp_link::frame_type::refuse &&
                tcp_link::parse_refuse(f->body) ==
                    static_cast<std::uint16_t>(transport_errc::limit_exceeded);
    }
    loop.post([&] { finished = true; });
  });
  run_until([&] { return finished; });
  raw.join();
  EXPECT_FALSE(accepted);
  EXPECT_TRUE(refused);
  EXPECT_EQ(server->stats().connections_refused, 1u);
  // The first link of node 1 is untouched.
  EXPECT_FALSE(try_write_and_send(*good).first);
  EXPECT_EQ(server->stats().links_accepted, 1u);
}

TEST(tcp_unauthenticated, works_when_both_sides_allow_it) {
  message_registry registry = test::test_registry();
  event_loop loop;
  real_environment env{loop};
  tcp_options o;
  o.allow_unauthenticated = true;
  auto ta = tcp_transport::make(loop, 1, o), tb = tcp_transport::make(loop, 2, o);
  node a{env, 1, ta, registry}, b{env, 2, tb, registry};
  ASSERT_FALSE(a.start());
  ASSERT_FALSE(b.start());
  ASSERT_FALSE(ta->add_peer(2, tb->local_address()));
  actor server(b, 1);
  std::optional<std::uint64_t> got;
  server.on<ping>([&](const envelope_header&, const ping& p) { got = p.nonce; });
  server.start();
  a.route({2, 1}, encode(envelope_header{.from = {1, 1}, .to = {2, 1}}, ping{.nonce = 99}));
  loop.run_until([&] { return got.has_value(); });
  EXPECT_EQ(got, 99u);
}

/// Sets or clears an environment variable for one test.
struct scoped_env {
  std::string name;
  scoped_env(std::string n, const char* value) : name(std::move(n)) {
    if (value) {
      ::setenv(name.c_str(), value, 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
  ~scoped_env() { ::unsetenv(name.c_str()); }
};

job_secret bytes_of(std::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return job_secret(p, p + s.size());
}

TEST(job_secret_loading, from_env_value_file_or_nothing) {
  {
    scoped_env file("FERRY_SECRET_FILE", nullptr), value("FERRY_SECRET", nullptr);
    auto s = load_job_secret();
    ASSERT_TRUE(s);
    EXPECT_TRUE(s->empty());
  }
  {
    scoped_env file("FERRY_SECRET_FILE", nullptr), value("FERRY_SECRET", "0123456789abcdef-env");
    EXPECT_EQ(load_job_secret(), bytes_of("0123456789abcdef-env"));
  }
  {
    scoped_env file("FERRY_SECRET_FILE", nullptr), value("FERRY_SECRET", "short");
    EXPECT_EQ(load_job_secret().error(), errc::invalid_argument);
  }
  const auto path =
      std::filesystem::temp_directory_path() / ("ferry_secret_" + std::to_string(::getpid()));
  std::ofstream(path) << "0123456789abcdef-file\n";
  {
    // The file wins over the value; its trailing newline is not part of the secret.
    scoped_env file("FERRY_SECRET_FILE", path.c_str()),
        value("FERRY_SECRET", "0123456789abcdef-env");
    EXPECT_EQ(load_job_secret(), bytes_of("0123456789abcdef-file"));
  }
  std::filesystem::remove(path);
  {
    scoped_env file("FERRY_SECRET_FILE", path.c_str()), value("FERRY_SECRET", nullptr);
    EXPECT_FALSE(load_job_secret());
  }
}

TEST(link_proofs, bind_role_nonces_and_node_ids) {
  const auto secret = test::test_secret();
  const auto n1 = make_link_nonce(), n2 = make_link_nonce();
  EXPECT_NE(n1, n2);
  const auto p = make_link_proof(secret, link_role::client, n1, n2, 1, 2);
  EXPECT_TRUE(same_proof(p, make_link_proof(secret, link_role::client, n1, n2, 1, 2)));
  EXPECT_FALSE(same_proof(p, make_link_proof(secret, link_role::server, n1, n2, 1, 2)));
  EXPECT_FALSE(same_proof(p, make_link_proof(secret, link_role::client, n2, n1, 1, 2)));
  EXPECT_FALSE(same_proof(p, make_link_proof(secret, link_role::client, n1, n2, 3, 2)));
  EXPECT_FALSE(
      same_proof(p, make_link_proof(test::test_secret('x'), link_role::client, n1, n2, 1, 2)));
}

TEST(link_handshake, both_sides_agree_on_the_key_and_each_finds_out_another_secret) {
  const auto secret = test::test_secret();
  client_handshake client(1, 2);
  server_handshake server(2, 1, client.nonce());
  const auto answer = client.answer(secret, server.nonce(), server.proof(secret));
  ASSERT_TRUE(answer);
  EXPECT_TRUE(server.holds(secret, *answer));
  EXPECT_EQ(client.session_key(secret), server.session_key(secret));
  EXPECT_NE(client.session_key(secret), *answer) << "the key is no proof that travelled";

  const auto other = test::test_secret('x');
  client_handshake stranger(1, 2);
  server_handshake its_server(2, 1, stranger.nonce());
  EXPECT_FALSE(stranger.answer(other, its_server.nonce(), its_server.proof(secret)));
  EXPECT_FALSE(server.holds(
      secret, make_link_proof(other, link_role::client, client.nonce(), server.nonce(), 1, 2)));
  server_handshake impostor(3, 1, client.nonce());
  EXPECT_FALSE(client_handshake(1, 2).answer(secret, impostor.nonce(), impostor.proof(secret)))
      << "a proof for another node, or another nonce";
}

}  // namespace
}  // namespace ferry
