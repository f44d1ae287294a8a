// A region given a new key (`transport::rekey_region`, a rollout worker's staging at each new
// epoch): a write of an older epoch, held up on a cut link, no longer lands over the new epoch's,
// and those the old key let in are waited for (`transport::when_writes_end`). A writer that
// remembers a peer it reached still sees a later cut, mend or close.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "platform/real_environment.hpp"
#include "runtime/virtual_environment.hpp"
#include "transport/errc.hpp"
#include "transport/inproc/inproc_transport.hpp"
#include "transport/region_table.hpp"

namespace ferry {
namespace {

bool all_equal(std::span<const std::byte> bytes, std::byte value) {
  return std::all_of(bytes.begin(), bytes.end(), [&](std::byte b) { return b == value; });
}

TEST(region_table, a_new_key_refuses_the_old_one_and_keeps_id_and_memory) {
  std::vector<std::byte> memory(4096);
  region_table table(7);
  const auto before = table.add(memory);
  const auto after = table.rekey(before.id);
  ASSERT_TRUE(after);
  EXPECT_EQ(after->owner, 7u);
  EXPECT_EQ(after->id, before.id);
  EXPECT_EQ(after->length, memory.size());
  EXPECT_NE(after->key, before.key);
  EXPECT_EQ(table.resolve(before.id, before.key, 0, 16).error(), transport_errc::key_mismatch);
  const auto landing = table.resolve(after->id, after->key, 16, 32);
  ASSERT_TRUE(landing);
  EXPECT_EQ(landing->data(), memory.data() + 16);
  EXPECT_EQ(table.rekey(before.id + 1).error(), transport_errc::unknown_region);
}

TEST(region_table, the_writes_an_old_key_let_in_are_waited_for) {
  std::vector<std::byte> memory(4096);
  region_table table(7);
  const auto old_key = table.add(memory);
  EXPECT_FALSE(table.when_writes_end(old_key.id, [] { FAIL() << "no write was under way"; }));
  ASSERT_TRUE(table.begin_write(old_key.id, old_key.key, 0, 64));
  ASSERT_TRUE(table.begin_write(old_key.id, old_key.key, 64, 64));
  const auto new_key = *table.rekey(old_key.id);
  EXPECT_FALSE(table.begin_write(old_key.id, old_key.key, 0, 64));  // refused: not under way
  int ended = 0;
  EXPECT_TRUE(table.when_writes_end(old_key.id, [&] { ++ended; }));
  table.end_write(old_key.id);
  EXPECT_EQ(ended, 0);
  table.end_write(old_key.id);
  EXPECT_EQ(ended, 1);
  EXPECT_FALSE(table.when_writes_end(new_key.id, [] {}));
  table.end_write(old_key.id);  // one too many: ignored
  // A region removed with writes under way tells its waiters at once.
  ASSERT_TRUE(table.begin_write(new_key.id, new_key.key, 0, 64));
  EXPECT_TRUE(table.when_writes_end(new_key.id, [&] { ++ended; }));
  table.remove(new_key.id);
  EXPECT_EQ(ended, 2);
  EXPECT_FALSE(table.when_writes_end(new_key.id, [] {}));
}

TEST(region_table, removal_waits_for_a_landing_copy_and_stops_later_ones) {
  std::vector<std::byte> memory(4096);
  region_table table(7);
  const auto r = table.add(memory);
  std::atomic<bool> copying = false, release = false, removed = false;
  std::thread lander([&] {
    EXPECT_TRUE(table.land(r.id, [&] {
      copying = true;
      while (!release) std::this_thread::yield();
      memory[0] = std::byte{1};
    }));
  });
  while (!copying) std::this_thread::yield();
  std::thread remover([&] {
    table.remove(r.id);
    removed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a removal that did not wait shows
  EXPECT_FALSE(removed) << "remove returned while a copy into the region ran";
  release = true;
  lander.join();
  remover.join();
  EXPECT_TRUE(removed);
  EXPECT_FALSE(table.land(r.id, [] { FAIL() << "a copy ran after its region was removed"; }));
}

/// Three inproc nodes on virtual time: 1 writes a slot of 2's in an old epoch, 3 in the new one.
struct cut_writer : ::testing::Test {
  event_loop loop;
  virtual_environment env{loop};
  inproc_network network;
  std::shared_ptr<inproc_transport> old_writer = inproc_transport::make(env, network, 1);
  std::shared_ptr<inproc_transport> receiver = inproc_transport::make(env, network, 2);
  std::shared_ptr<inproc_transport> new_writer = inproc_transport::make(env, network, 3);
  std::vector<std::byte> slot = std::vector<std::byte>(4096),
                         old_bytes = std::vector<std::byte>(4096, std::byte{0xaa}),
                         new_bytes = std::vector<std::byte>(4096, std::byte{0xbb});
  std::vector<write_notice> landed;

  void SetUp() override {
    ASSERT_FALSE(old_writer->start({}));
    ASSERT_FALSE(new_writer->start({}));
    ASSERT_FALSE(
        receiver->start({.on_write = [this](const write_notice& n) { landed.push_back(n); }}));
    const std::pair<inproc_transport*, node_id> nodes[] = {
        {old_writer.get(), 1}, {receiver.get(), 2}, {new_writer.get(), 3}};
    for (const auto& [t, self] : nodes) {
      for (const node_id peer : {1u, 2u, 3u}) {
        if (peer == self) continue;
        ASSERT_FALSE(t->add_peer(peer, std::to_string(peer)));
      }
    }
    ASSERT_TRUE(old_writer->register_region(old_bytes));
    ASSERT_TRUE(new_writer->register_region(new_bytes));
  }

  std::error_code write(inproc_transport& from, std::span<const std::byte> bytes,
                        const region_desc& to) {
    std::optional<std::error_code> result;
    from.async_write(bytes, to, 0, 0, [&](std::error_code ec) { result = ec; });
    loop.run_until([&] { return result.has_value(); });
    return *result;
  }
};

TEST_F(cut_writer, a_held_write_lands_when_the_key_is_kept) {
  // What a worker did before it rekeyed its staging: the old epoch's bytes land last.
  const auto region = *receiver->register_region(slot);
  network.cut(1);
  EXPECT_FALSE(write(*old_writer, old_bytes, region));  // the "kernel" holds it
  EXPECT_FALSE(write(*new_writer, new_bytes, region));
  EXPECT_TRUE(all_equal(slot, std::byte{0xbb}));
  network.mend(1);
  loop.run_until([&] { return landed.size() == 2; });
  EXPECT_TRUE(all_equal(slot, std::byte{0xaa}));
}

TEST_F(cut_writer, a_held_write_of_the_old_key_does_not_land_after_a_rekey) {
  const auto old_key = *receiver->register_region(slot);
  network.cut(1);
  EXPECT_FALSE(write(*old_writer, old_bytes, old_key));
  const auto new_key = receiver->rekey_region(old_key.id);
  ASSERT_TRUE(new_key);
  EXPECT_EQ(write(*new_writer, new_bytes, old_key), transport_errc::key_mismatch);
  EXPECT_TRUE(all_equal(slot, std::byte{0}));
  EXPECT_FALSE(write(*new_writer, new_bytes, *new_key));
  network.mend(1);
  // The held write arrives first and is refused (were it not, node 1's notice would come second):
  // node 3's next write still lands.
  std::ranges::fill(new_bytes, std::byte{0xcc});
  EXPECT_FALSE(write(*new_writer, new_bytes, *new_key));
  loop.run_until([&] { return landed.size() == 2; });
  EXPECT_TRUE(all_equal(slot, std::byte{0xcc}));
  ASSERT_EQ(landed.size(), 2u);
  EXPECT_EQ(landed[0].from, 3u);
  EXPECT_EQ(landed[1].from, 3u);
}

TEST_F(cut_writer, a_write_the_old_key_let_in_is_under_way_until_it_completes) {
  const auto old_key = *receiver->register_region(slot);
  bool done = false, ended = false;
  old_writer->async_write(old_bytes, old_key, 0, 0, [&](std::error_code ec) { done = !ec; });
  const auto new_key = receiver->rekey_region(old_key.id);
  ASSERT_TRUE(new_key);
  EXPECT_TRUE(receiver->when_writes_end(old_key.id, [&] { ended = true; }));
  EXPECT_FALSE(ended);  // told on the loop, never inside the call
  loop.run_until([&] { return ended && done; });
  EXPECT_FALSE(receiver->when_writes_end(old_key.id, [] {}));
  // A write held by a cut is not under way: it is checked again when it arrives.
  network.cut(1);
  EXPECT_FALSE(write(*old_writer, old_bytes, *new_key));
  EXPECT_FALSE(receiver->when_writes_end(old_key.id, [] {}));
}

TEST_F(cut_writer, a_peer_reached_before_a_cut_is_held_by_it_until_the_mend) {
  const auto region = *receiver->register_region(slot);
  EXPECT_FALSE(write(*old_writer, old_bytes, region));
  loop.run_until([&] { return landed.size() == 1; });
  network.cut(2);
  std::ranges::fill(old_bytes, std::byte{0xdd});
  EXPECT_FALSE(write(*old_writer, old_bytes, region));  // held, as the cut's first write would be
  EXPECT_EQ(landed.size(), 1u);
  EXPECT_TRUE(all_equal(slot, std::byte{0xaa}));
  network.mend(2);
  loop.run_until([&] { return landed.size() == 2; });
  EXPECT_TRUE(all_equal(slot, std::byte{0xdd}));
  // Mended, writes land straight away again.
  std::ranges::fill(old_bytes, std::byte{0xee});
  EXPECT_FALSE(write(*old_writer, old_bytes, region));
  EXPECT_TRUE(all_equal(slot, std::byte{0xee}));
}

TEST_F(cut_writer,
       a_peer_reached_before_and_closed_since_is_unreachable_and_its_successor_is_found) {
  const auto region = *receiver->register_region(slot);
  EXPECT_FALSE(write(*old_writer, old_bytes, region));
  receiver->close();
  EXPECT_EQ(write(*old_writer, old_bytes, region), transport_errc::peer_unreachable);
  auto successor = inproc_transport::make(env, network, 2);
  std::vector<write_notice> successor_landed;
  ASSERT_FALSE(successor->start(
      {.on_write = [&](const write_notice& n) { successor_landed.push_back(n); }}));
  std::vector<std::byte> successor_slot(4096);
  std::ranges::fill(old_bytes, std::byte{0x11});
  EXPECT_FALSE(write(*old_writer, old_bytes, *successor->register_region(successor_slot)));
  loop.run_until([&] { return successor_landed.size() == 1; });
  EXPECT_TRUE(all_equal(successor_slot, std::byte{0x11}));
  EXPECT_TRUE(all_equal(slot, std::byte{0xaa}));
}

TEST(inproc_transport, deregistering_a_region_stops_the_copies_into_it) {
  event_loop loop;
  real_environment env{loop};  // copies run on the pool's threads
  inproc_network network;
  auto writer = inproc_transport::make(env, network, 1);
  auto receiver = inproc_transport::make(env, network, 2);
  ASSERT_FALSE(writer->start({}));
  ASSERT_FALSE(receiver->start({}));
  // Every pool thread busy: the copies wait in its queue until the region is gone.
  std::atomic<bool> release = false;
  for (unsigned i = 0; i < env.cpu().parallelism(); ++i) {
    env.cpu().async_run(
        0,
        [&] {
          while (!release) std::this_thread::yield();
        },
        [] {});
  }
  constexpr std::size_t block = std::size_t{1} << 20, blocks = 8;
  std::vector<std::byte> source(block * blocks, std::byte{0x5a}), target(source.size());
  ASSERT_TRUE(writer->register_region(source));
  const auto remote = *receiver->register_region(target);
  std::vector<std::error_code> results;
  for (std::size_t i = 0; i < blocks; ++i) {
    writer->async_write(std::span<const std::byte>(source).subspan(i * block, block), remote,
                        i * block, 0, [&](std::error_code ec) { results.push_back(ec); });
  }
  ASSERT_TRUE(receiver->when_writes_end(remote.id, [] {}));  // they passed the check
  receiver->deregister_region(remote.id);                    // its owner may free the memory now
  release = true;
  env.wait_idle();
  EXPECT_TRUE(std::all_of(target.begin(), target.end(), [](std::byte b) {
    return b == std::byte{0};
  })) << "bytes landed after deregister_region returned";
  loop.run_until([&] { return results.size() == blocks; });
  ASSERT_EQ(results.size(), blocks);
  EXPECT_EQ(std::count(results.begin(), results.end(), transport_errc::unknown_region), blocks);
}

TEST(inproc_transport, rekeying_a_region_it_does_not_hold_fails) {
  event_loop loop;
  virtual_environment env{loop};
  inproc_network network;
  auto t = inproc_transport::make(env, network, 1);
  EXPECT_EQ(t->rekey_region(42).error(), transport_errc::unknown_region);
}

}  // namespace
}  // namespace ferry
