/// The cma transport (tcp links, same-host copies) between two real processes: this test writes,
/// a cma_test_peer child receives, checks the bytes and reports what landed.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <set>

#include "platform/real_environment.hpp"
#include "runtime/actor.hpp"
#include "runtime/node.hpp"
#include "tcp_test_support.hpp"
#include "transport/errc.hpp"
#include "transport/tcp/tcp_transport.hpp"

extern char** environ;

namespace ferry {
namespace {

using namespace std::chrono_literals;

/// The child's copy threads: CMA_TEST_COPY_THREADS (inherited by the child) or the default.
unsigned copy_threads() {
  const char* threads = std::getenv("CMA_TEST_COPY_THREADS");
  return threads ? static_cast<unsigned>(std::stoul(threads)) : tcp_options{}.copy_threads;
}

/// This process is node 1, the child node 2; every write carries `test_write_tag`.
class cma_processes : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::setenv("FERRY_SECRET", "cma two-process test secret, 32 bytes", 1), 0);
    auto secret = load_job_secret();
    ASSERT_TRUE(secret && !secret->empty());
    tcp_options options;
    options.secret = *secret;
    options.same_host_copy = true;
    transport_ = tcp_transport::make(loop_, 1, options);
    node_.emplace(env_, 1, transport_, registry_);
    ASSERT_FALSE(node_->start());
    ASSERT_EQ(transport_->scheme(), "cma");
    driver_.emplace(*node_, 1);
    driver_->on<test::peer_hello>([this](const envelope_header&, const test::peer_hello& h) {
      EXPECT_FALSE(transport_->add_peer(2, h.address));
      remote_ = h.region;
    });
    driver_->on<test::landed>(
        [this](const envelope_header&, const test::landed& l) { landings_.push_back(l); });
    driver_->on<test::region_report>(
        [this](const envelope_header&, const test::region_report& r) { report_ = r; });
    driver_->start();
  }

  void TearDown() override {
    if (child_ > 0 && !child_exited_) {
      driver_->send(address{2, 1}, test::bye{});
      run_until([] { return false; }, 30s);  // until the child exits
      if (!child_exited_) {
        ::kill(child_, SIGKILL);
        ::waitpid(child_, &status_, 0);
        ADD_FAILURE() << "the child did not exit after bye";
      } else {
        EXPECT_TRUE(WIFEXITED(status_) && WEXITSTATUS(status_) == 0) << "child status " << status_;
      }
    }
    if (driver_) {
      driver_->stop();
      loop_.run_until([&] { return driver_->finished(); });
    }
  }

  /// Starts the child with a zeroed region of `bytes` and waits for its descriptor.
  void start_child(std::size_t bytes) {
    std::vector<std::string> args{FERRY_CMA_TEST_PEER, transport_->local_address(), "1", "2",
                                  std::to_string(bytes)};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ASSERT_EQ(posix_spawn(&child_, argv[0], nullptr, nullptr, argv.data(), environ), 0);
    ASSERT_TRUE(run_until([&] { return remote_.has_value(); })) << "no hello from the child";
    ASSERT_EQ(remote_->length, bytes);
  }

  /// Runs the loop until `done`, the child exits, or `limit` passes; returns `done()`.
  bool run_until(const std::function<bool()>& done, std::chrono::seconds limit = 60s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    bool expired = false;
    auto ticking = std::make_shared<bool>(true);
    std::uint64_t timer = 0;
    std::function<void()> tick = [&] {
      if (!child_exited_ && child_ > 0 && ::waitpid(child_, &status_, WNOHANG) == child_)
        child_exited_ = true;
      expired = std::chrono::steady_clock::now() > deadline;
      timer = node_->clock().async_wait(50ms, [ticking, t = &tick](std::error_code ec) {
        if (!ec && *ticking) (*t)();
      });
    };
    tick();
    loop_.run_until([&] { return done() || expired || child_exited_; });
    *ticking = false;
    node_->clock().cancel(timer);
    return done();
  }

  /// One write of `from` (a slice of a patterned source) to `offset`; its completion's error.
  std::error_code write(std::span<const std::byte> from, const region_desc& to,
                        std::uint64_t offset, std::uint32_t value) {
    std::optional<std::error_code> result;
    transport_->async_write(from, to, offset, make_imm(test::test_write_tag, value),
                            [&](std::error_code ec) { result = ec; });
    EXPECT_TRUE(run_until([&] { return result.has_value(); })) << "no completion";
    return result.value_or(errc::timed_out);
  }

  /// Bytes of the child's region range that are not zero.
  std::uint64_t nonzero_bytes(std::uint64_t offset, std::uint64_t length) {
    report_.reset();
    driver_->send(address{2, 1}, test::inspect{.offset = offset, .length = length});
    EXPECT_TRUE(run_until([&] { return report_.has_value(); })) << "no region report";
    return report_ ? report_->nonzero_bytes : ~std::uint64_t{0};
  }

  message_registry registry_ = test::test_registry();
  event_loop loop_;
  real_environment env_{loop_};
  std::shared_ptr<tcp_transport> transport_;
  std::optional<node> node_;
  pid_t child_ = 0;
  int status_ = 0;
  bool child_exited_ = false;
  std::optional<region_desc> remote_;
  std::vector<test::landed> landings_;
  std::optional<test::region_report> report_;
  std::optional<actor> driver_;  ///< last: its handlers use the members above
};

TEST_F(cma_processes, a_256_mib_write_lands_byte_exact_with_its_imm) {
  constexpr std::size_t bytes = std::size_t{256} << 20;
  std::vector<std::byte> source(bytes);
  test::fill_pattern(source);
  ASSERT_TRUE(transport_->register_region(source));
  start_child(bytes);

  // Three rounds: the child verifies every byte of each; the GB/s is for the log only.
  for (std::uint32_t round = 1; round <= 3; ++round) {
    const auto started = std::chrono::steady_clock::now();
    const auto ec = write(source, *remote_, 0, 0x100 + round);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    ASSERT_FALSE(ec) << ec.message();
    ASSERT_TRUE(run_until([&] { return landings_.size() == round; }));
    const auto& l = landings_.back();
    EXPECT_EQ(l.offset, 0u);
    EXPECT_EQ(l.length, bytes);
    EXPECT_EQ(l.imm, make_imm(test::test_write_tag, 0x100 + round));
    EXPECT_EQ(l.mismatched_words, 0u);
    std::printf(
        "cma two-process write, round %u: %zu MiB in %.4f s = %.2f GB/s (%u copy threads; "
        "completion = acked by the child)\n",
        round, bytes >> 20, seconds, static_cast<double>(bytes) / seconds / 1e9, copy_threads());
  }
  EXPECT_EQ(transport_->stats().copies_failed, 0u);
}

TEST_F(cma_processes, eight_writes_four_in_flight_all_land) {
  constexpr std::size_t block = std::size_t{16} << 20, blocks = 8, window = 4;
  std::vector<std::byte> source(block * blocks);
  test::fill_pattern(source);
  ASSERT_TRUE(transport_->register_region(source));
  start_child(source.size());

  // Blocks from the last to the first, at most `window` in flight; each completion starts the
  // next. Completions may arrive in any order.
  std::vector<int> completions(blocks, 0);
  std::size_t next = 0, in_flight = 0, failed = 0;
  std::function<void()> fill = [&] {
    while (in_flight < window && next < blocks) {
      const auto i = blocks - 1 - next++;
      ++in_flight;
      transport_->async_write(std::span<const std::byte>(source).subspan(i * block, block),
                              *remote_, i * block, make_imm(test::test_write_tag, 0x200 + i),
                              [&, i](std::error_code ec) {
                                EXPECT_FALSE(ec) << "block " << i << ": " << ec.message();
                                failed += ec ? 1 : 0;
                                ++completions[i];
                                --in_flight;
                                fill();
                              });
    }
  };
  fill();
  ASSERT_TRUE(
      run_until([&] { return landings_.size() == blocks && in_flight == 0 && next == blocks; }));
  EXPECT_EQ(failed, 0u);
  EXPECT_TRUE(std::all_of(completions.begin(), completions.end(), [](int c) { return c == 1; }));
  std::set<std::uint32_t> imms;
  for (const auto& l : landings_) {
    EXPECT_EQ(l.length, block);
    EXPECT_EQ(l.offset % block, 0u);
    EXPECT_EQ(l.imm,
              make_imm(test::test_write_tag, 0x200 + static_cast<std::uint32_t>(l.offset / block)));
    EXPECT_EQ(l.mismatched_words, 0u) << "block at " << l.offset;
    imms.insert(l.imm);
  }
  EXPECT_EQ(imms.size(), blocks);
}

TEST_F(cma_processes, bad_writes_are_refused_and_the_target_stays_untouched) {
  constexpr std::size_t region = std::size_t{1} << 20;
  std::vector<std::byte> source(64 << 10);
  test::fill_pattern(source);
  ASSERT_TRUE(transport_->register_region(source));
  start_child(region);

  auto wrong_key = *remote_;
  wrong_key.key ^= 1;
  auto unknown = *remote_;
  unknown.id += 100;
  EXPECT_EQ(write(source, wrong_key, 0, 1), transport_errc::key_mismatch);
  EXPECT_EQ(write(source, unknown, 0, 2), transport_errc::unknown_region);
  EXPECT_EQ(write(source, *remote_, region - 100, 3), transport_errc::out_of_bounds);
  EXPECT_EQ(write(source, *remote_, ~std::uint64_t{0} - 10, 4), transport_errc::out_of_bounds);
  // The report follows the refusals on the same link: a write that had landed would precede it.
  EXPECT_EQ(nonzero_bytes(0, region), 0u);
  EXPECT_TRUE(landings_.empty());

  // The link still carries writes.
  EXPECT_FALSE(write(source, *remote_, 0, 5));
  ASSERT_TRUE(run_until([&] { return landings_.size() == 1; }));
  EXPECT_EQ(landings_[0].imm, make_imm(test::test_write_tag, 5));
  EXPECT_EQ(landings_[0].mismatched_words, 0u);
  EXPECT_EQ(nonzero_bytes(source.size(), region - source.size()), 0u);
}

}  // namespace
}  // namespace ferry
