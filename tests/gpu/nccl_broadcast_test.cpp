#include "collectives/nccl/nccl_broadcast.hpp"

#include <gtest/gtest.h>

#include <barrier>
#include <cstring>
#include <mutex>
#include <thread>

#include "actors/messages.hpp"
#include "platform/cuda/cuda_device_memory.hpp"
#include "platform/cuda/cuda_error.hpp"
#include "platform/real_environment.hpp"
#include "protocol/protocol.hpp"
#include "runtime/host_buffer.hpp"
#include "runtime/node.hpp"
#include "transport/factory.hpp"

namespace ferry {
namespace {

std::byte pattern(std::uint32_t chunk, std::size_t i) {
  return static_cast<std::byte>((i * 131 + chunk * 7 + (i >> 12)) & 0xff);
}

/// What one rank saw: empty when every byte it received is right.
struct rank_result {
  std::string error;
};

/// Ranks 0..n-1 of one group, each on its own thread, loop, tcp node and GPU.
void run_rank(std::uint32_t rank, std::uint32_t ranks, std::vector<std::string>& addresses,
              std::mutex& mutex, std::barrier<>& sync, rank_result& out) {
  constexpr std::size_t chunk = std::size_t{32} << 20;
  constexpr std::uint32_t chunks = 6;  // more than the 2 slots, so slots are reused
  constexpr std::size_t stripe = std::size_t{4} << 20;
  event_loop loop;
  real_environment environment(loop);
  transport_settings env;
  env.allow_unauthenticated = true;
  auto t = make_transport("tcp", environment, rank + 1, env);
  if (!t) {
    out.error = "transport: " + t.error().message();
    sync.arrive_and_wait();
    sync.arrive_and_wait();
    return;
  }
  node n(environment, rank + 1, *t, protocol());
  (void)n.start();
  {
    std::lock_guard lock(mutex);
    addresses[rank] = n.transport().local_address();
  }
  sync.arrive_and_wait();
  std::vector<address> members;
  for (std::uint32_t r = 0; r < ranks; ++r) {
    members.push_back({r + 1, 1});
    if (r != rank) (void)n.transport().add_peer(r + 1, addresses[r]);
  }
  actor a(n, 1);
  a.start();

  cuda_device_memory memory(static_cast<int>(rank));
  auto slots = memory.allocate(2 * chunk);
  auto gathered = memory.allocate(stripe * ranks);
  host_buffer host(chunk * chunks);
  host_buffer stripe_host(stripe * ranks);
  {
    auto group = std::make_unique<nccl_broadcast>(a, members, 1, static_cast<int>(rank));
    // Each chunk: the root uploads it into a slot, everyone broadcasts the slot, reads it back.
    std::uint32_t finished = 0;
    std::error_code failure;
    for (std::uint32_t c = 0; c < chunks; ++c) {
      std::byte* slot = *slots + (c % 2) * chunk;
      std::byte* dst = host.data() + std::size_t{c} * chunk;
      if (rank == 0) {
        for (std::size_t i = 0; i < chunk; ++i) dst[i] = pattern(c, i);
        (void)cuda_copy_blocking(slot, dst, chunk);
      }
      bool done = false;
      group->async_broadcast({.bytes = {slot, chunk}, .device = static_cast<int>(rank)},
                             [&](std::error_code ec) {
                               if (ec) failure = ec;
                               done = true;
                             });
      loop.run_until([&] { return done; });
      if (failure) break;
      (void)cuda_copy_blocking(dst, slot, chunk);
      ++finished;
    }
    if (failure) out.error = "broadcast: " + failure.message();
    for (std::uint32_t c = 0; c < finished && out.error.empty(); ++c) {
      const std::byte* got = host.data() + std::size_t{c} * chunk;
      for (std::size_t i = 0; i < chunk; ++i) {
        if (got[i] != pattern(c, i)) {
          out.error = "rank " + std::to_string(rank) + ": chunk " + std::to_string(c) + " byte " +
                      std::to_string(i);
          break;
        }
      }
    }
    // Striped all-gather, with every rank owning a stripe and with fewer stripes than ranks:
    // the stripe owners fill theirs with r + 1 (the last stripe shorter), then all hold all.
    const std::size_t gathered_bytes = stripe * ranks - 1000;
    for (std::uint32_t stripes : {ranks, std::max(ranks - 1, 1u)}) {
      std::memset(stripe_host.data(), 0, stripe * ranks);
      const auto part = stripe_of(gathered_bytes, stripes, rank);
      if (rank < stripes)
        std::memset(stripe_host.data() + part.offset, static_cast<int>(rank + 1), part.bytes);
      (void)cuda_copy_blocking(*gathered, stripe_host.data(), gathered_bytes);
      bool gathered_done = false;
      group->async_all_gather(
          {.bytes = {*gathered, gathered_bytes}, .device = static_cast<int>(rank)}, stripes,
          [&](std::error_code ec) {
            if (ec && out.error.empty()) out.error = "all-gather: " + ec.message();
            gathered_done = true;
          });
      loop.run_until([&] { return gathered_done; });
      (void)cuda_copy_blocking(stripe_host.data(), *gathered, gathered_bytes);
      for (std::uint32_t r = 0; r < stripes && out.error.empty(); ++r) {
        const auto theirs = stripe_of(gathered_bytes, stripes, r);
        for (std::size_t i = theirs.offset; i < theirs.offset + theirs.bytes; ++i) {
          if (stripe_host.data()[i] != static_cast<std::byte>(r + 1)) {
            out.error = "rank " + std::to_string(rank) + ": stripe " + std::to_string(r) + " of " +
                        std::to_string(stripes) + " is wrong at byte " + std::to_string(i);
            break;
          }
        }
      }
    }
    sync.arrive_and_wait();  // nobody tears its communicator down while a peer still uses it
    // After abort, a new call fails with `stopped`, exactly once.
    group->abort();
    int calls = 0;
    std::error_code after;
    group->async_broadcast({.bytes = {*slots, chunk}}, [&](std::error_code ec) {
      after = ec;
      ++calls;
    });
    loop.run_until([&] { return calls == 1; });
    if (after != std::error_code(errc::stopped) && out.error.empty())
      out.error = "after abort: " + after.message();
  }
  a.stop();
  loop.run_until([&] { return a.finished(); });
  memory.release(*slots);
  memory.release(*gathered);
}

TEST(nccl_broadcast, ranks_on_separate_gpus_get_every_byte_and_all_gather_every_stripe) {
  const int devices = cuda_device_count();
  if (devices < 2) GTEST_SKIP() << devices << " CUDA devices; the group needs 2";
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  const std::uint32_t ranks = std::min(devices, 3);
  std::vector<std::string> addresses(ranks);
  std::vector<rank_result> results(ranks);
  std::mutex mutex;
  std::barrier sync(static_cast<std::ptrdiff_t>(ranks));
  std::vector<std::thread> threads;
  for (std::uint32_t r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] { run_rank(r, ranks, addresses, mutex, sync, results[r]); });
  }
  for (auto& t : threads) t.join();
  for (std::uint32_t r = 0; r < ranks; ++r) EXPECT_EQ(results[r].error, "") << "rank " << r;
}

}  // namespace
}  // namespace ferry
