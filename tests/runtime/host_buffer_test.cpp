#include "runtime/host_buffer.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

namespace ferry {
namespace {

TEST(host_buffer, a_plain_buffer_is_zeroed_and_not_shareable) {
  host_buffer b(1 << 20);
  EXPECT_EQ(b.size(), 1u << 20);
  EXPECT_EQ(b.data()[12345], std::byte{0});
  EXPECT_EQ(b.shared_ref().pid, 0);
}

/// How many of `b`'s pages are in memory now.
std::size_t resident_pages(const host_buffer& b) {
  std::vector<unsigned char> in_core((b.size() + 4095) / 4096);
  if (mincore(b.data(), b.size(), in_core.data()) != 0) return 0;
  std::size_t n = 0;
  for (const auto page : in_core) n += page & 1;
  return n;
}

TEST(host_buffer, pages_are_faulted_in_up_front_until_prefaulting_stops) {
  constexpr std::size_t bytes = 32 << 20;
  const host_buffer before(bytes);
  EXPECT_EQ(resident_pages(before), bytes / 4096);
  const pid_t child = fork();
  if (child == 0) {  // stopping is for the whole process, and for good: in a child
    host_buffer::stop_prefaulting();
    host_buffer plain(bytes);
    auto shareable = host_buffer::shareable(bytes);
    if (resident_pages(plain) != 0 || resident_pages(shareable) != 0) _exit(2);
    plain.data()[bytes - 1] = std::byte{9};  // still usable: a first touch faults the page in
    if (plain.data()[bytes - 1] != std::byte{9} || plain.data()[0] != std::byte{0}) _exit(3);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: pages faulted in after the stop, 3: wrong bytes";
}

TEST(host_buffer, a_mapping_of_a_shareable_buffer_sees_and_changes_the_same_bytes) {
  auto owner = host_buffer::shareable(3 << 20);
  const auto ref = owner.shared_ref();
  EXPECT_EQ(ref.pid, getpid());
  EXPECT_EQ(ref.bytes, 3u << 20);
  std::memset(owner.data() + 4096, 0x5a, 100);
  std::string why;
  auto view = host_buffer::map_shared(ref, why);
  ASSERT_TRUE(view) << why;
  EXPECT_NE(view->data(), owner.data());
  EXPECT_EQ(view->data()[4096 + 99], std::byte{0x5a});
  EXPECT_EQ(view->data()[4096 + 100], std::byte{0});
  view->data()[0] = std::byte{7};
  EXPECT_EQ(owner.data()[0], std::byte{7});
}

TEST(host_buffer, another_process_reads_a_shareable_buffer_through_its_pid_and_fd) {
  auto owner = host_buffer::shareable(1 << 20);
  for (std::size_t i = 0; i < owner.size(); ++i) owner.data()[i] = std::byte(i * 7 % 251);
  const auto ref = owner.shared_ref();
  const pid_t child = fork();
  if (child == 0) {  // the child maps the parent's memfd by the parent's pid, as a leader would
    std::string why;
    auto view = host_buffer::map_shared(ref, why);
    if (!view) _exit(2);
    for (std::size_t i = 0; i < view->size(); ++i) {
      if (view->data()[i] != std::byte(i * 7 % 251)) _exit(3);
    }
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: could not map, 3: wrong bytes";
}

TEST(host_buffer, a_reference_to_nothing_or_to_another_buffer_is_refused_with_the_reason) {
  auto owner = host_buffer::shareable(1 << 20);
  auto ref = owner.shared_ref();
  std::string why;
  auto elsewhere = ref;
  elsewhere.host ^= 1;
  EXPECT_FALSE(host_buffer::map_shared(elsewhere, why));
  EXPECT_NE(why.find("runs on another host"), std::string::npos) << why;
  // The same pid and fd numbers, later naming another memfd (the owner died, the pid was reused).
  auto replaced = ref;
  replaced.inode += 1;
  EXPECT_FALSE(host_buffer::map_shared(replaced, why));
  EXPECT_NE(why.find("is not the 1048576-byte buffer it was announced as"), std::string::npos)
      << why;
  auto wrong_size = ref;
  wrong_size.bytes = 2 << 20;
  EXPECT_FALSE(host_buffer::map_shared(wrong_size, why));
  EXPECT_NE(why.find("is not the 2097152-byte buffer"), std::string::npos) << why;
  auto no_fd = ref;
  no_fd.fd = 1 << 20;
  EXPECT_FALSE(host_buffer::map_shared(no_fd, why));
  EXPECT_NE(why.find("cannot open /proc/"), std::string::npos) << why;
}

}  // namespace
}  // namespace ferry
