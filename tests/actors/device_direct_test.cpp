/// GPU to GPU on virtual time: trainers and workers on (virtual) GPUs, the plan choosing per pair
/// between device-direct (one host: the worker maps the trainer's device copies and copies from
/// them), GPUDirect (the transport writes from the trainer's device copies into the worker's GPU)
/// and the host copy, with every byte compared. A virtual GPU's memory is host memory kept alive
/// by reference counts, as CUDA VMM's is, so a trainer killed mid-update leaves its readers valid
/// bytes until the regroup drops their mapping.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/coordinator.hpp"
#include "actors/rollout_worker.hpp"
#include "actors/trainer_shard.hpp"
#include "protocol/protocol.hpp"
#include "runtime/node.hpp"
#include "runtime/virtual_environment.hpp"
#include "tests/actors/memory_collective.hpp"
#include "tests/actors/virtual_device.hpp"
#include "transport/inproc/inproc_transport.hpp"

namespace ferry {
namespace {

using testing::virtual_device;

constexpr std::uint64_t model_bytes = 1 << 20;
constexpr std::size_t broadcast_slots =
    2 * 16384;  ///< a worker's on its GPU: depth 2 of 16 KiB chunks
const std::string trainer_gpu = "GPU-trainer";

/// One job on virtual time: node 0 the coordinator, then a node per member, each member on its
/// own virtual GPU (pid 1000 + node).
class device_direct : public ::testing::Test {
 protected:
  /// The coordinator of a job of one trainer and `instance_sizes`, under `p2p`; with `gpudirect`,
  /// the transport reaches the GPUs' memory.
  void start(std::vector<std::uint32_t> instance_sizes, p2p_mode p2p = p2p_mode::automatic,
             bool gpudirect = false) {
    if (gpudirect) network.reach_device_memory();
    add_node();
    coordinator =
        std::make_unique<job_coordinator>(*nodes[0], 1,
                                          job_shape{.trainers = 1,
                                                    .instance_sizes = std::move(instance_sizes),
                                                    .chunk_bytes = 16384,
                                                    .p2p = p2p});
    coordinator->on_delivered = [this](const version_report& r) { reports.push_back(r); };
    coordinator->on_failed = [this](const std::string& why) { failure = why; };
    coordinator->start();
  }

  node& add_node() {
    const auto id = static_cast<node_id>(nodes.size());
    nodes.push_back(
        std::make_unique<node>(env, id, inproc_transport::make(env, network, id), protocol()));
    EXPECT_FALSE(nodes.back()->start());
    if (id != 0) {
      EXPECT_FALSE(network.find(id)->add_peer(0, "0"));
    }
    return *nodes.back();
  }

  /// A GPU for the next member, on node `host` of host `host_tag`, reading the GPUs `reads` besides
  /// its own.
  virtual_device& gpu(const node& host, std::string name, std::vector<std::string> reads,
                      std::uint64_t host_tag = 7) {
    reads.push_back(name);
    devices.push_back(std::make_unique<virtual_device>(
        env, shared, 0, 1000 + static_cast<std::int32_t>(host.id()), std::move(name),
        std::move(reads), host_tag));
    return *devices.back();
  }

  /// The trainer shard, on a node and GPU of its own, publishing `weights`.
  void add_trainer() {
    auto& host = add_node();
    trainer_node = host.id();
    trainer = std::make_unique<trainer_shard>(
        host, 1, address{0, 1}, 0,
        std::vector<tensor_ref>{{.spec = spec, .data = weights.data(), .device = 0}},
        trainer_options{.memory = &gpu(host, trainer_gpu, {})});
    trainer->join();
  }

  /// A worker of `instance` on a node of its own whose GPU reads the trainer's when `reads_trainer`
  /// (on another host when `elsewhere`); it holds `rows` rows of the 1024 (all: the whole tensor)
  /// from `first_row`.
  rollout_worker& add_worker(std::uint32_t instance, std::uint32_t rank, bool reads_trainer,
                             std::uint64_t first_row = 0, std::uint64_t rows = 1024,
                             bool elsewhere = false) {
    auto& host = add_node();
    auto& bytes = held.emplace_back(std::make_unique<std::vector<std::byte>>(rows * 1024));
    tensor_ref t{.spec = spec, .data = bytes->data(), .device = 0};
    if (rows < 1024) t.part = byte_range{first_row * 1024, rows * 1024};
    auto& device = gpu(host, "GPU-" + std::to_string(host.id()),
                       reads_trainer ? std::vector{trainer_gpu} : std::vector<std::string>{},
                       elsewhere ? 8 : 7);
    workers.push_back(std::make_unique<rollout_worker>(
        host, 1, address{0, 1}, instance, rank, std::vector<tensor_ref>{t},
        worker_options{.memory = &device, .make_broadcast = collectives}));
    workers.back()->join();
    return *workers.back();
  }

  /// Publishes `version` with bytes of its own; true once it is delivered.
  bool deliver(std::uint64_t version) {
    for (std::size_t i = 0; i < weights.size(); ++i)
      weights[i] = static_cast<std::byte>(i * 13 + version * 7);
    if (!run_until([&] { return trainer->ready(); })) return false;
    std::string why;
    EXPECT_TRUE(trainer->publish(version, why)) << why;
    return run_until([&] { return !reports.empty() && reports.back().version == version; });
  }

  /// The trainer and an instance of three whole-model workers on another host (every one a
  /// leader of a stripe); versions 1 and 2 delivered, every byte compared.
  void deliver_to_three_gpu_leaders_elsewhere() {
    add_trainer();
    for (std::uint32_t r = 0; r < 3; ++r) add_worker(0, r, false, 0, 1024, true);
    for (std::uint64_t v = 1; v <= 2; ++v) {
      ASSERT_TRUE(deliver(v)) << failure;
      EXPECT_TRUE(reports.back().verified);
      for (std::size_t w = 0; w < 3; ++w)
        EXPECT_TRUE(holds_published(w)) << "worker " << w << ", version " << v;
    }
  }

  /// Worker `w`'s bytes equal the published rows it holds.
  bool holds_published(std::size_t w, std::uint64_t first_row = 0) {
    const auto& bytes = *held.at(w);
    return std::equal(bytes.begin(), bytes.end(),
                      weights.begin() + static_cast<std::ptrdiff_t>(first_row * 1024));
  }

  bool run_until(const std::function<bool()>& done) {
    loop.run_until([&] {
      return done() || !failure.empty() ||
             env.clock().now() >= clock::time_point(std::chrono::seconds(60));
    });
    return done();
  }

  event_loop loop;
  virtual_environment env{loop, cpu_cost_model{.bytes_per_second = 1e9}};
  inproc_network network;
  testing::virtual_shared_memory shared;
  std::vector<std::unique_ptr<node>> nodes;
  std::vector<std::unique_ptr<virtual_device>> devices;
  std::unique_ptr<job_coordinator> coordinator;
  std::vector<std::byte> weights = std::vector<std::byte>(model_bytes);
  tensor_spec spec = make_tensor_spec("w", dtype::u8, {1024, 1024});
  std::unique_ptr<trainer_shard> trainer;
  node_id trainer_node = 0;
  std::vector<std::unique_ptr<std::vector<std::byte>>> held;
  broadcast_factory collectives = testing::memory_collectives();
  std::vector<std::unique_ptr<rollout_worker>> workers;
  std::vector<version_report> reports;
  std::string failure;
};

TEST_F(device_direct, workers_whose_gpus_read_the_trainers_copy_every_version_gpu_to_gpu) {
  start({1, 1});
  add_trainer();
  add_worker(0, 0, true);
  add_worker(1, 0, true);

  for (std::uint64_t v = 1; v <= 3; ++v) {
    ASSERT_TRUE(deliver(v)) << failure;
    EXPECT_TRUE(reports.back().verified);
    EXPECT_TRUE(holds_published(0));
    EXPECT_TRUE(holds_published(1));
    EXPECT_EQ(reports.back().busy.send, 0) << "a chunk was written, not read in place";
    EXPECT_GT(reports.back().busy.upload, 0) << "no copy from the trainer's device copy";
  }
  EXPECT_EQ(shared.maps, 2) << "each worker maps the trainer's device copies once";
  coordinator->stop_job();
}

TEST_F(device_direct, a_worker_whose_gpu_cannot_read_the_trainers_gets_the_host_copy) {
  start({1, 1});
  add_trainer();
  add_worker(0, 0, true);
  add_worker(1, 0, false);

  for (std::uint64_t v = 1; v <= 2; ++v) {
    ASSERT_TRUE(deliver(v)) << failure;
    EXPECT_TRUE(reports.back().verified);
    EXPECT_TRUE(holds_published(0));
    EXPECT_TRUE(holds_published(1));
    EXPECT_GT(reports.back().busy.send, 0) << "the second worker was not written to";
  }
  EXPECT_EQ(shared.maps, 1) << "only the first worker reads GPU to GPU";
  coordinator->stop_job();
}

TEST_F(device_direct, host_mode_never_reads_gpu_to_gpu) {
  start({1}, p2p_mode::host);
  add_trainer();
  add_worker(0, 0, true);

  ASSERT_TRUE(deliver(1)) << failure;
  EXPECT_TRUE(holds_published(0));
  EXPECT_EQ(shared.maps, 0);
  EXPECT_EQ(shared.exported.size(), 0u) << "the trainer made device copies nobody reads";
  coordinator->stop_job();
}

/// A worker that cannot read the trainer's GPU joins after a version went GPU to GPU only: the
/// trainer makes its host copy then, from its device copy, and the joiner is caught up from it.
TEST_F(device_direct, a_host_copy_made_for_a_late_joiner_holds_the_version_sent_gpu_to_gpu) {
  start({1});
  add_trainer();
  add_worker(0, 0, true);
  ASSERT_TRUE(deliver(1)) << failure;
  EXPECT_EQ(reports.back().busy.send, 0);

  auto& joiner = add_worker(1, 0, false);
  ASSERT_TRUE(run_until([&] { return joiner.version() == 1; })) << failure;
  EXPECT_TRUE(holds_published(1));
  ASSERT_TRUE(deliver(2)) << failure;
  EXPECT_TRUE(holds_published(0));
  EXPECT_TRUE(holds_published(1));
  coordinator->stop_job();
}

/// Row-parallel workers of one instance each hear their own rows: each reads them GPU to GPU.
TEST_F(device_direct, selective_delivery_reads_each_workers_rows_gpu_to_gpu) {
  start({2});
  add_trainer();
  add_worker(0, 0, true, 0, 512);
  add_worker(0, 1, true, 512, 512);

  ASSERT_TRUE(deliver(1)) << failure;
  EXPECT_TRUE(reports.back().verified);
  EXPECT_TRUE(holds_published(0, 0));
  EXPECT_TRUE(holds_published(1, 512));
  EXPECT_EQ(reports.back().busy.send, 0);
  EXPECT_EQ(shared.maps, 2);
  coordinator->stop_job();
}

/// The trainer's process dies mid-update: what its readers mapped stays valid (reference counted)
/// until the regroup drops it, the version fails, and a replacement's next version arrives.
TEST_F(device_direct, a_trainer_killed_mid_update_is_replaced_and_its_memory_let_go) {
  start({1});
  add_trainer();
  add_worker(0, 0, true);
  ASSERT_TRUE(deliver(1)) << failure;

  for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = std::byte{0x5a};
  std::string why;
  ASSERT_TRUE(trainer->publish(2, why)) << why;
  ASSERT_TRUE(run_until([&] {
    return reports.back().version == 1 && coordinator->current_plan() && !coordinator->idle();
  }));
  const auto dead_copies = shared.exported.begin()->first;
  network.sever(trainer_node);
  env.end_process(1000 + static_cast<std::int32_t>(trainer_node));
  trainer.reset();  // the process and its hold on its device copies are gone
  EXPECT_FALSE(shared.exported.at(dead_copies).bytes.expired())
      << "the worker's mapping no longer holds what it reads";

  add_trainer();
  ASSERT_TRUE(run_until([&] { return trainer->ready(); })) << failure;
  EXPECT_TRUE(shared.exported.at(dead_copies).bytes.expired())
      << "the worker kept the dead trainer's memory";
  const auto next = trainer->next_version();
  EXPECT_GE(next, 2u);
  ASSERT_TRUE(deliver(next)) << failure;
  EXPECT_TRUE(reports.back().verified);
  EXPECT_TRUE(holds_published(0));
  coordinator->stop_job();
}

TEST_F(device_direct, device_mode_fails_the_job_naming_a_gpu_that_cannot_read_the_trainers) {
  start({1}, p2p_mode::device);
  add_trainer();
  add_worker(0, 0, false);
  for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = std::byte{1};
  ASSERT_TRUE(run_until([&] { return trainer->ready(); }));
  std::string why;
  ASSERT_TRUE(trainer->publish(1, why)) << why;
  run_until([] { return false; });
  EXPECT_NE(failure.find("no peer access to GPU " + trainer_gpu), std::string::npos) << failure;
}

/// A worker on another host whose transport reaches both GPUs is written GPU to GPU: from the
/// trainer's device copy straight into its GPU's receive slots, with no upload after.
TEST_F(device_direct, a_worker_on_another_host_is_written_into_its_gpu_by_gpudirect) {
  start({1}, p2p_mode::automatic, true);
  add_trainer();
  add_worker(0, 0, false, 0, 1024, true);

  for (std::uint64_t v = 1; v <= 2; ++v) {
    ASSERT_TRUE(deliver(v)) << failure;
    EXPECT_TRUE(reports.back().verified);
    EXPECT_TRUE(holds_published(0));
    EXPECT_GT(reports.back().busy.send, 0) << "nothing was written";
    EXPECT_EQ(reports.back().busy.upload, 0)
        << "the chunks landed in host memory and were uploaded";
  }
  EXPECT_EQ(coordinator->current_plan()->paths().gpudirect, 1u);
  EXPECT_EQ(devices.back()->allocated, 2 * broadcast_slots)
      << "the receive slots are not on the worker's GPU";
  EXPECT_EQ(shared.maps, 0);
  coordinator->stop_job();
}

TEST_F(device_direct,
       without_gpudirect_a_worker_on_another_host_gets_the_host_copy_and_uploads_it) {
  start({1});
  add_trainer();
  add_worker(0, 0, false, 0, 1024, true);

  ASSERT_TRUE(deliver(1)) << failure;
  EXPECT_TRUE(holds_published(0));
  EXPECT_GT(reports.back().busy.upload, 0);
  EXPECT_EQ(coordinator->current_plan()->paths().gpudirect, 0u);
  EXPECT_EQ(devices.back()->allocated, broadcast_slots)
      << "receive slots on a GPU no write reaches";
  coordinator->stop_job();
}

/// Every member of an instance on GPUs leads a stripe; written into host memory (no GPUDirect),
/// each leader's receive slots hold its stripe alone, which it uploads into the chunk's place.
TEST_F(device_direct, gpu_leaders_receiving_in_host_memory_hold_and_upload_their_stripe_alone) {
  start({3});
  ASSERT_NO_FATAL_FAILURE(deliver_to_three_gpu_leaders_elsewhere());
  EXPECT_EQ(coordinator->current_plan()->instances[0].leaders.size(), 3u);
  coordinator->stop_job();
}

/// The same written into the GPUs by GPUDirect: each leader's slots there hold its stripe alone,
/// which it copies into a broadcast slot for the gather.
TEST_F(device_direct, gpu_leaders_written_by_gpudirect_hold_their_stripe_alone) {
  start({3}, p2p_mode::automatic, true);
  ASSERT_NO_FATAL_FAILURE(deliver_to_three_gpu_leaders_elsewhere());
  EXPECT_EQ(coordinator->current_plan()->paths().gpudirect, 3u);
  // Each leader's GPU: its broadcast slots, and a stripe (a third of a chunk) per receive slot.
  const std::size_t stripe_slots = 2 * stripe_of(16384, 3, 0).bytes;
  for (std::size_t d = 1; d < devices.size(); ++d)
    EXPECT_EQ(devices[d]->allocated, broadcast_slots + stripe_slots);
  coordinator->stop_job();
}

/// A member refuses memory the host does not have, naming it, rather than being killed for it.
TEST_F(device_direct, a_trainer_refuses_host_copies_beyond_what_the_host_has) {
  env.limit_host_memory(model_bytes);  // less than the two host copies a worker elsewhere needs
  start({1});
  add_trainer();
  add_worker(0, 0, false, 0, 1024, true);

  EXPECT_FALSE(deliver(1));
  EXPECT_NE(failure.find("the host copies need"), std::string::npos) << failure;
}

/// A GPU without room for the receive slots keeps them in host memory: written there and uploaded.
TEST_F(device_direct, receive_slots_that_do_not_fit_the_gpu_stay_in_host_memory) {
  start({1}, p2p_mode::automatic, true);
  add_trainer();
  add_worker(0, 0, false, 0, 1024, true);
  devices.back()->capacity = broadcast_slots;  // its broadcast slots, and no more

  ASSERT_TRUE(deliver(1)) << failure;
  EXPECT_TRUE(reports.back().verified);
  EXPECT_TRUE(holds_published(0));
  EXPECT_GT(reports.back().busy.upload, 0);
  EXPECT_EQ(devices.back()->allocated, broadcast_slots);
  coordinator->stop_job();
}

/// Row-parallel workers on another host: the direct slots each grants are on its GPU too.
TEST_F(device_direct, selective_delivery_over_gpudirect_lands_each_workers_rows_in_its_gpu) {
  start({2}, p2p_mode::automatic, true);
  add_trainer();
  add_worker(0, 0, false, 0, 512, true);
  add_worker(0, 1, false, 512, 512, true);

  ASSERT_TRUE(deliver(1)) << failure;
  EXPECT_TRUE(reports.back().verified);
  EXPECT_TRUE(holds_published(0, 0));
  EXPECT_TRUE(holds_published(1, 512));
  EXPECT_EQ(coordinator->current_plan()->paths().gpudirect, 2u);
  for (std::size_t w = 1; w <= 2; ++w)
    EXPECT_GT(devices.at(w)->allocated, broadcast_slots)
        << "worker " << w << "'s slots are not on its GPU";
  coordinator->stop_job();
}

}  // namespace
}  // namespace ferry
