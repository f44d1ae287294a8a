#include "platform/cuda/cuda_copy_engine.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "platform/cuda/cuda_device_memory.hpp"
#include "platform/cuda/cuda_error.hpp"
#include "runtime/host_buffer.hpp"

namespace ferry {
namespace {

void fill_pattern(std::span<std::byte> bytes, std::uint64_t seed) {
  std::uint64_t x = seed | 1;
  for (std::size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(bytes.data() + i, &x, 8);
  }
}

TEST(cuda_copy_engine, host_to_device_to_device_to_host_keeps_every_byte) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  constexpr std::size_t bytes = std::size_t{256} << 20;
  event_loop loop;
  cuda_device_memory memory(0);
  auto engine = cuda_copy_engine::make(loop, 0);
  ASSERT_TRUE(engine) << engine.error().message();

  host_buffer source(bytes), back(bytes);
  fill_pattern(source.span(), 42);
  ASSERT_FALSE(memory.pin(source.span()));
  ASSERT_FALSE(memory.pin(back.span()));
  auto a = memory.allocate(bytes);
  auto b = memory.allocate(bytes);
  ASSERT_TRUE(a && b);

  // Three copies in a row, the second in two pieces, each completing on the loop's thread.
  const auto loop_thread = std::this_thread::get_id();
  int done = 0;
  std::error_code failure;
  auto step = [&](std::error_code ec) {
    EXPECT_EQ(std::this_thread::get_id(), loop_thread);
    if (ec) failure = ec;
    ++done;
  };
  (*engine)->async_copy({{*a, source.data(), bytes}}, step);
  (*engine)->async_copy({{*b, *a, bytes / 2}, {*b + bytes / 2, *a + bytes / 2, bytes / 2}}, step);
  (*engine)->async_copy({{back.data(), *b, bytes}}, step);
  loop.run_until([&] { return done == 3; });
  EXPECT_FALSE(failure) << failure.message();
  EXPECT_EQ(std::memcmp(source.data(), back.data(), bytes), 0);

  memory.release(*a);
  memory.release(*b);
  memory.unpin(source.span());
  memory.unpin(back.span());
}

TEST(cuda_device_memory, refuses_zero_bytes_and_reports_its_device) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  cuda_device_memory memory(0);
  EXPECT_EQ(memory.device(), 0);
  EXPECT_FALSE(memory.allocate(0));
}

TEST(cuda_copy_engine, an_absent_device_is_an_error_not_a_crash) {
  event_loop loop;
  auto engine = cuda_copy_engine::make(loop, 1 << 20);
  EXPECT_FALSE(engine);
}

}  // namespace
}  // namespace ferry
