#include "transport/tcp/process_copier.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <memory>
#include <optional>

#include "tcp_test_support.hpp"
#include "transport/errc.hpp"

namespace ferry {
namespace {

std::uint64_t address_of(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

struct process_copier_test : ::testing::Test {
  event_loop loop;

  /// One copy's error, run to completion on the loop (or -1 after 30 s).
  int copy(process_copier& copier, pid_t pid, std::uint64_t source, std::span<std::byte> target,
           std::uint64_t region = 1) {
    auto result = std::make_shared<std::optional<int>>();
    auto expired = std::make_shared<bool>(false);
    boost::asio::steady_timer timer(loop.io(), std::chrono::seconds(30));
    timer.async_wait([expired](const boost::system::error_code& ec) { *expired = !ec; });
    copier.async_copy(pid, source, target, region, [result](int error) { *result = error; });
    EXPECT_FALSE(*result) << "completed inside async_copy";
    loop.run_until([&] { return result->has_value() || *expired; });
    return result->value_or(-1);
  }
};

TEST_F(process_copier_test, copies_a_buffer_of_this_process_in_parallel_pieces) {
  process_copier copier(loop, 4);
  EXPECT_EQ(copier.threads(), 4u);
  // Not a multiple of the piece size: the last piece is short and ends on an odd byte.
  std::vector<std::byte> source((std::size_t{64} << 20) + 13), target(source.size());
  test::fill_pattern(source);
  EXPECT_EQ(copy(copier, ::getpid(), address_of(source.data()), target), 0);
  EXPECT_TRUE(source == target);
}

TEST_F(process_copier_test, copies_from_another_process) {
  // The child holds the pattern at the same address as ours (fork); we then clear ours, so only
  // a read of the child's memory can bring the pattern back.
  std::vector<std::byte> source(std::size_t{16} << 20), target(source.size());
  test::fill_pattern(source);
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char c;
    ::close(go[1]);
    [[maybe_unused]] const auto n = ::read(go[0], &c, 1);  // returns when the parent closes
    ::_exit(0);
  }
  ::close(go[0]);
  std::fill(source.begin(), source.end(), std::byte{0});
  process_copier copier(loop, 4);
  EXPECT_EQ(copy(copier, child, address_of(source.data()), target), 0);
  ::close(go[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(test::pattern_mismatches(target), 0u);
}

TEST_F(process_copier_test, an_empty_copy_completes_on_the_loop) {
  process_copier copier(loop, 2);
  EXPECT_EQ(copy(copier, ::getpid(), 0, {}), 0);
}

TEST_F(process_copier_test, unreadable_bytes_fail_with_efault_even_after_a_partial_read) {
  process_copier copier(loop, 2);
  // 8 MiB whose last page nothing may read: the second piece reads up to it and stops there.
  constexpr std::size_t bytes = std::size_t{8} << 20;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  ASSERT_EQ(::mprotect(static_cast<std::byte*>(map) + bytes - page, page, PROT_NONE), 0);
  std::vector<std::byte> target(bytes);
  EXPECT_EQ(copy(copier, ::getpid(), address_of(map), target), EFAULT);
  ::munmap(map, bytes);
  EXPECT_EQ(copy_error_code(EFAULT), transport_errc::copy_failed);
}

TEST_F(process_copier_test, a_process_that_is_gone_fails_with_esrch) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  process_copier copier(loop, 2);
  std::vector<std::byte> source(4096), target(4096);
  EXPECT_EQ(copy(copier, child, address_of(source.data()), target), ESRCH);
  EXPECT_EQ(copy_error_code(ESRCH), transport_errc::copy_failed);
}

TEST_F(process_copier_test, eperm_maps_to_its_own_code_and_names_ptrace_scope) {
  EXPECT_EQ(copy_error_code(EPERM), transport_errc::copy_not_permitted);
  EXPECT_NE(copy_error_text(EPERM, 42).find("kernel.yama.ptrace_scope"), std::string::npos);
  EXPECT_NE(copy_error_text(ESRCH, 42).find("42"), std::string::npos);
}

TEST_F(process_copier_test, after_stop_no_byte_lands) {
  process_copier copier(loop, 2);
  copier.stop();
  std::vector<std::byte> source(std::size_t{8} << 20, std::byte{7}), target(source.size());
  EXPECT_EQ(copy(copier, ::getpid(), address_of(source.data()), target), ECANCELED);
  EXPECT_TRUE(
      std::all_of(target.begin(), target.end(), [](std::byte b) { return b == std::byte{0}; }));
}

TEST_F(process_copier_test, a_forgotten_region_takes_no_byte_and_the_others_still_do) {
  process_copier copier(loop, 1);  // one piece at a time: the later ones are still queued
  std::vector<std::byte> source(std::size_t{256} << 20, std::byte{7}), target(source.size());
  int forgotten_result = -1;
  copier.async_copy(::getpid(), address_of(source.data()), target, 5,
                    [&](int e) { forgotten_result = e; });
  copier.forget_region(5);
  const std::vector<std::byte> after = target;
  EXPECT_EQ(copy(copier, ::getpid(), address_of(source.data()), target, 5), ECANCELED);
  EXPECT_TRUE(target == after) << "bytes landed after forget_region returned";
  loop.run_until([&] { return forgotten_result != -1; });
  // Its first piece may have run before the call; the rest were skipped.
  EXPECT_EQ(forgotten_result, ECANCELED);
  // Another region copies as before.
  std::vector<std::byte> other(std::size_t{8} << 20);
  EXPECT_EQ(copy(copier, ::getpid(), address_of(source.data()), other, 6), 0);
  EXPECT_TRUE(
      std::all_of(other.begin(), other.end(), [](std::byte b) { return b == std::byte{7}; }));
}

}  // namespace
}  // namespace ferry
