// The peer watch on real sockets and real processes: a SIGKILLed peer is reported at once, a
// forgotten one never; a greeting that does not prove the secret is refused, and its greeter does
// not take that for a death; an address nobody listens at is a peer gone.
#include "transport/peer_watch.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <set>
#include <string>

namespace ferry {
namespace {

using namespace std::chrono_literals;

job_secret secret_of(char c) {
  return job_secret(32, std::byte(c));
}

/// A process that listens with a peer watch (as node `id`) until killed; its address.
struct watched_process {
  pid_t pid = -1;
  std::string address;
  watched_process(node_id id, const job_secret& secret) {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    pid = fork();
    if (pid == 0) {
      asio::io_context io;
      auto watch = peer_watch::make(io, id, secret, [](node_id) {});
      if (watch->listen("127.0.0.1")) _exit(1);
      const auto at = watch->address() + "\n";
      if (write(fds[1], at.data(), at.size()) != static_cast<ssize_t>(at.size())) _exit(1);
      auto work = asio::make_work_guard(io);
      io.run();
      _exit(0);
    }
    close(fds[1]);
    char buffer[128] = {};
    const auto n = read(fds[0], buffer, sizeof buffer - 1);
    close(fds[0]);
    address = std::string(buffer, n > 0 ? static_cast<std::size_t>(n) - 1 : 0);
  }
  void kill_now() {
    ::kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
};

/// Runs `io` until `done()` or `limit`.
template <class Done>
void run_until(asio::io_context& io, Done done, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done() && std::chrono::steady_clock::now() < end) io.run_for(10ms);
}

TEST(peer_watch, a_killed_peer_is_reported_at_once_and_a_forgotten_one_never) {
  const auto secret = secret_of('s');
  watched_process a(2, secret), b(3, secret);
  ASSERT_FALSE(a.address.empty());
  ASSERT_FALSE(b.address.empty());
  asio::io_context io;
  std::multiset<node_id> gone;
  auto watch = peer_watch::make(io, 1, secret, [&](node_id peer) { gone.insert(peer); });
  watch->watch(2, a.address);
  watch->watch(3, b.address);
  io.run_for(200ms);  // both greeted and held
  EXPECT_TRUE(gone.empty());
  watch->forget(3);
  const auto killed = std::chrono::steady_clock::now();
  a.kill_now();
  b.kill_now();
  run_until(
      io, [&] { return !gone.empty(); }, 5000ms);
  const auto seen = std::chrono::steady_clock::now() - killed;
  io.run_for(300ms);
  EXPECT_EQ(gone, std::multiset<node_id>{2});
  std::printf("the death of node 2 was seen %.1f ms after its SIGKILL\n",
              std::chrono::duration<double, std::milli>(seen).count());
  watch->close();
}

TEST(peer_watch,
     a_greeting_without_the_secret_is_refused_and_an_address_nobody_listens_at_is_gone) {
  asio::io_context io;
  auto listener = peer_watch::make(io, 1, secret_of('s'), [](node_id) {});
  ASSERT_FALSE(listener->listen("127.0.0.1"));
  std::multiset<node_id> gone;
  auto note = [&](node_id peer) { gone.insert(peer); };
  auto holder = peer_watch::make(io, 2, secret_of('s'), note);
  auto stranger = peer_watch::make(io, 3, secret_of('x'), note);
  holder->watch(1, listener->address());
  stranger->watch(1, listener->address());  // its greeting fails: refused, not a death

  asio::ip::tcp::socket raw(io);  // bytes that are no greeting at all
  raw.connect({asio::ip::make_address("127.0.0.1"),
               static_cast<std::uint16_t>(
                   std::stoi(listener->address().substr(listener->address().rfind(':') + 1)))});
  asio::write(raw, asio::buffer(std::string(76, 'G')));
  bool raw_closed = false;
  std::size_t raw_got = 0;
  std::array<char, 8> sink{};
  asio::async_read(raw, asio::buffer(sink),
                   [&](const boost::system::error_code& ec, std::size_t n) {
                     raw_closed = ec == asio::error::eof;
                     raw_got = n;
                   });

  asio::ip::tcp::acceptor nobody(io, {asio::ip::make_address("127.0.0.1"), 0});
  const auto port = nobody.local_endpoint().port();
  nobody.close();
  holder->watch(4, "127.0.0.1:" + std::to_string(port));

  run_until(
      io, [&] { return gone.size() >= 1 && raw_closed; }, 5000ms);
  io.run_for(200ms);
  EXPECT_TRUE(raw_closed) << "bytes that are no greeting kept their connection";
  EXPECT_EQ(raw_got, 1u);                      // the refusal
  EXPECT_EQ(gone, std::multiset<node_id>{4});  // nobody at 4; node 1 lives for both
  for (auto* w : {listener.get(), holder.get(), stranger.get()}) w->close();
}

// A greeting replayed under a live peer's id must not close that peer's connection: it would see
// this node die. Five greeters of one id: the first ones are held, the one past the share is
// refused, and none sees an end.
TEST(peer_watch, a_greeting_again_under_a_held_id_never_ends_the_held_connection) {
  asio::io_context io;
  auto listener = peer_watch::make(io, 1, secret_of('s'), [](node_id) {});
  ASSERT_FALSE(listener->listen("127.0.0.1"));
  std::multiset<node_id> gone;
  std::vector<std::shared_ptr<peer_watch>> greeters;
  for (int i = 0; i < 5; ++i) {
    greeters.push_back(
        peer_watch::make(io, 2, secret_of('s'), [&](node_id peer) { gone.insert(peer); }));
    greeters.back()->watch(1, listener->address());
    io.run_for(50ms);
  }
  io.run_for(300ms);
  EXPECT_TRUE(gone.empty()) << gone.size() << " greeter(s) of node 2 saw node 1, alive, end";
  for (auto& g : greeters) g->close();
  listener->close();
}

}  // namespace
}  // namespace ferry
