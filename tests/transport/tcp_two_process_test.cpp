#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "platform/real_environment.hpp"
#include "runtime/actor.hpp"
#include "runtime/node.hpp"
#include "tcp_test_support.hpp"
#include "transport/tcp/tcp_transport.hpp"

extern char** environ;

namespace ferry {
namespace {

/// Starts the child with `args`; the job secret travels in its environment, never in argv.
pid_t spawn_child(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

TEST(tcp_two_processes, messages_and_a_256_mib_write_verified_by_the_child) {
  constexpr std::size_t bytes = std::size_t{256} << 20;
  constexpr int pings = 20;
  ASSERT_EQ(::setenv("FERRY_SECRET", "two-process test secret, 32 bytes!", 1), 0);
  auto secret = load_job_secret();
  ASSERT_TRUE(secret && !secret->empty());

  const auto registry = test::test_registry();
  event_loop loop;
  real_environment env(loop);
  tcp_options options;
  options.secret = *secret;
  auto transport = tcp_transport::make(loop, 1, options);
  node n(env, 1, transport, registry);
  ASSERT_FALSE(n.start());

  std::vector<std::byte> source(bytes);
  test::fill_pattern(source);
  const auto source_hash = XXH3_64bits(source.data(), source.size());
  ASSERT_TRUE(transport->register_region(source));

  const pid_t child = spawn_child(
      {FERRY_TCP_TEST_PEER, transport->local_address(), "1", "2", std::to_string(bytes)});
  ASSERT_GT(child, 0);

  // Declared before the actor: its destructor may still turn the loop, and the watch with it.
  int status = 0;
  bool exited = false, expired = false;
  std::function<void()> watch;
  actor driver(n, 1);
  std::optional<region_desc> remote;
  std::vector<std::uint64_t> pongs;
  std::optional<std::error_code> write_result;
  std::optional<test::verdict> verdict;
  std::chrono::steady_clock::time_point write_started, write_finished;
  auto start_write = [&] {
    write_started = std::chrono::steady_clock::now();
    transport->async_write(
        source, *remote, 0, make_imm(test::test_write_tag, 1), [&](std::error_code ec) {
          write_finished = std::chrono::steady_clock::now();
          write_result = ec;
          if (!ec)
            driver.send(address{2, 1}, test::write_done{.length = bytes, .hash = source_hash});
        });
  };
  driver.on<test::peer_hello>([&](const envelope_header& h, const test::peer_hello& hello) {
    EXPECT_EQ(h.from, (address{2, 1}));
    EXPECT_FALSE(transport->add_peer(2, hello.address));
    remote = hello.region;
    driver.send(address{2, 1}, ping{.nonce = 1, .payload = "child, ping 1"});
  });
  driver.on<pong>([&](const envelope_header&, const pong& p) {
    EXPECT_EQ(p.payload, "child, ping " + std::to_string(p.nonce));
    pongs.push_back(p.nonce);
    if (p.nonce < pings) {
      driver.send(address{2, 1}, ping{.nonce = p.nonce + 1,
                                      .payload = "child, ping " + std::to_string(p.nonce + 1)});
    } else {
      start_write();
    }
  });
  driver.on<test::verdict>([&](const envelope_header&, const test::verdict& v) {
    verdict = v;
    driver.send(address{2, 1}, test::bye{});
  });
  driver.start();

  // Wake up now and then to notice a child that died early; give up after a deadline.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  watch = [&] {
    if (!exited && ::waitpid(child, &status, WNOHANG) == child) exited = true;
    expired = std::chrono::steady_clock::now() > deadline;
    if (!exited && !expired)
      n.clock().async_wait(std::chrono::milliseconds(50), [&](std::error_code) { watch(); });
  };
  watch();
  loop.run_until([&] { return exited || expired; });
  if (!exited) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
  }
  ASSERT_FALSE(expired) << "timed out";

  std::vector<std::uint64_t> expected(pings);
  std::iota(expected.begin(), expected.end(), 1);
  EXPECT_EQ(pongs, expected);
  ASSERT_TRUE(write_result.has_value());
  EXPECT_FALSE(*write_result) << write_result->message();
  ASSERT_TRUE(verdict.has_value());
  EXPECT_TRUE(verdict->ok);
  EXPECT_EQ(verdict->length, bytes);
  EXPECT_EQ(verdict->hash, source_hash);
  EXPECT_EQ(verdict->mismatched_words, 0u);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);

  const double seconds = std::chrono::duration<double>(write_finished - write_started).count();
  std::printf(
      "tcp two-process bulk write: %zu MiB in %.3f s = %.2f GB/s (completion = acked by the "
      "child)\n",
      bytes >> 20, seconds, static_cast<double>(bytes) / seconds / 1e9);
  driver.stop();
  loop.run_until([&] { return driver.finished(); });
}

}  // namespace
}  // namespace ferry
