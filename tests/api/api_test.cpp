#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "actors/plan.hpp"
#include "ferry/ferry.h"
#include "ferry/ferry.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;

constexpr const char* secret = "api-test-secret-of-32-bytes-long";

/// A small table: two tensors of different dtypes, one of them not a multiple of the chunk.
struct table {
  std::vector<float> weight = std::vector<float>(96 * 1024);
  std::vector<std::uint16_t> bias = std::vector<std::uint16_t>(3000);
  void fill(std::uint64_t version) {
    for (std::size_t i = 0; i < weight.size(); ++i)
      weight[i] = static_cast<float>(version * 1000003 + i);
    for (std::size_t i = 0; i < bias.size(); ++i)
      bias[i] = static_cast<std::uint16_t>(version * 31 + i);
  }
  std::vector<tensor> tensors() {
    return {{.name = "layer.weight", .dtype = "f32", .shape = {96, 1024}, .data = weight.data()},
            {.name = "layer.bias", .dtype = "bf16", .shape = {3000}, .data = bias.data()}};
  }
  bool operator==(const table&) const = default;
};

coordinator::options job(std::vector<std::uint32_t> instances) {
  return {.secret = secret,
          .trainers = 1,
          .instance_sizes = std::move(instances),
          .chunk_bytes = 64 * 1024};
}

// The files themselves: tests/python (a rollout on shm, SIGKILLed) and the fabric transport's
// tests.
TEST(api, clean_up_after_a_killed_process_refuses_one_that_runs) {
  std::size_t removed = 7;
  const auto running = clean_up_killed_process(getpid(), &removed);
  EXPECT_EQ(running.code, make_error_code(api_errc::invalid_argument));
  EXPECT_NE(running.message.find("still runs"), std::string::npos) << running.message;
  EXPECT_EQ(removed, 0u);
  EXPECT_EQ(ferry_clean_up_killed_process(0, nullptr), FERRY_INVALID_ARGUMENT);

  const pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  ASSERT_GT(child, 0);
  EXPECT_EQ(ferry_clean_up_killed_process(child, &removed), FERRY_INVALID_ARGUMENT)
      << ferry_last_error();
  kill(child, SIGKILL);
  siginfo_t ended{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(child), &ended, WEXITED | WNOWAIT),
            0);  // dead, not reaped
  EXPECT_EQ(ferry_clean_up_killed_process(child, &removed), FERRY_OK) << ferry_last_error();
  EXPECT_EQ(removed, 0u);  // it opened no shm endpoint
  waitpid(child, nullptr, 0);
}

TEST(api, a_trainer_and_two_rollouts_receive_every_version_byte_for_byte) {
  status ok;
  coordinator coord(job({2}), ok);
  ASSERT_TRUE(ok) << ok.message;
  ASSERT_EQ(coord.address().rfind("tcp://127.0.0.1:", 0), 0u) << coord.address();

  table sent;
  trainer t({{.coordinator = coord.address(), .secret = secret}});
  for (const auto& x : sent.tensors()) ASSERT_TRUE(t.register_tensor(x));

  std::array<table, 2> got;
  std::vector<std::unique_ptr<rollout>> workers;
  std::mutex m;
  std::map<std::string, std::uint64_t> per_tensor;  // worker 1's on_tensor calls, by name
  for (std::uint32_t r = 0; r < 2; ++r) {
    workers.push_back(std::make_unique<rollout>(
        rollout::options{{.coordinator = coord.address(), .secret = secret}, 0, r}));
  }
  // Worker 0 says where each tensor lands; worker 1 registers nothing, takes the trainers' table
  // and copies each tensor out of ferry's memory as it completes.
  for (const auto& x : got[0].tensors()) ASSERT_TRUE(workers[0]->register_tensor(x));
  workers[1]->on_tensor([&](std::uint64_t, const tensor& x, std::span<const std::byte> bytes) {
    std::lock_guard lock(m);
    per_tensor[x.name] += bytes.size();
    for (const auto& want : got[1].tensors()) {
      if (want.name != x.name) continue;
      EXPECT_EQ(want.dtype, x.dtype);
      EXPECT_EQ(want.shape, x.shape);
      std::memcpy(want.data, bytes.data(), bytes.size());
    }
  });
  ASSERT_TRUE(t.join());
  for (auto& w : workers) ASSERT_TRUE(w->join());

  for (const std::uint64_t v : {1, 2, 5}) {  // versions may skip numbers (a trainer's step count)
    sent.fill(v);
    trainer::update u(nullptr);
    auto s = t.publish(v, &u);
    ASSERT_TRUE(s) << s.message;
    ASSERT_TRUE(u.wait_offloaded(30s));
    auto d = u.wait_delivered(30s);
    ASSERT_TRUE(d) << d.message;
    for (std::uint32_t r = 0; r < 2; ++r) {
      ASSERT_TRUE(workers[r]->wait_version(v, 30s));
      EXPECT_TRUE(got[r] == sent) << "worker " << r << " differs at version " << v;
    }
    EXPECT_TRUE(coord.wait_delivered(v, 30s));
  }
  std::lock_guard lock(m);
  EXPECT_EQ(per_tensor["layer.weight"], 3 * sent.weight.size() * 4);
  EXPECT_EQ(per_tensor["layer.bias"], 3 * sent.bias.size() * 2);
}

// The registered tensors only name the table: what leaves is what `write` was given, and a chunk
// leaves once its tensors are written, before the rest of the version is.
TEST(api, a_written_publish_sends_what_was_written_each_chunk_once_whole) {
  status ok;
  coordinator coord(job({1}), ok);
  ASSERT_TRUE(ok) << ok.message;
  table registered, sent, got;
  trainer t({{.coordinator = coord.address(), .secret = secret}});
  for (const auto& x : registered.tensors()) ASSERT_TRUE(t.register_tensor(x));
  rollout w(rollout::options{{.coordinator = coord.address(), .secret = secret}, 0, 0});
  for (const auto& x : got.tensors()) ASSERT_TRUE(w.register_tensor(x));
  std::mutex m;
  std::condition_variable arrived;
  std::map<std::string, std::uint64_t> bytes_of;  // this version's, by tensor
  w.on_tensor([&](std::uint64_t, const tensor& x, std::span<const std::byte> bytes) {
    std::lock_guard lock(m);
    bytes_of[x.name] += bytes.size();
    arrived.notify_all();
  });
  const auto bytes = [](const auto& v) { return std::as_bytes(std::span(v)); };
  const auto refused = make_error_code(api_errc::invalid_argument);
  EXPECT_EQ(t.write("layer.bias", bytes(sent.bias), 1s).code, refused);  // no written publish
  ASSERT_TRUE(t.join());
  ASSERT_TRUE(w.join());

  for (const std::uint64_t v : {1, 2, 3}) {
    registered.fill(1000 + v);  // never sent: the written bytes are
    sent.fill(v);
    {
      std::lock_guard lock(m);
      bytes_of.clear();
    }
    trainer::update u(nullptr);
    ASSERT_TRUE(t.publish_written(v, &u));
    EXPECT_EQ(t.publish(v + 10).code, make_error_code(api_errc::busy));
    EXPECT_EQ(t.write("layer.none", bytes(sent.bias), 1s).code, refused);
    EXPECT_EQ(t.write("layer.bias", bytes(sent.weight), 1s).code, refused);  // the wrong size
    ASSERT_TRUE(t.write("layer.weight", bytes(sent.weight), 30s));
    {
      std::unique_lock lock(m);
      const auto weight_here = [&] { return bytes_of["layer.weight"] == sent.weight.size() * 4; };
      EXPECT_TRUE(arrived.wait_for(lock, 30s, weight_here))
          << "version " << v << ": the weight did not arrive before the bias was written";
      EXPECT_EQ(bytes_of["layer.bias"], 0u);
    }
    EXPECT_EQ(t.write("layer.weight", bytes(sent.weight), 1s).code, refused);  // twice
    ASSERT_TRUE(t.write("layer.bias", bytes(sent.bias), 30s));
    ASSERT_TRUE(u.wait_offloaded(30s));
    auto d = u.wait_delivered(30s);
    ASSERT_TRUE(d) << d.message;
    ASSERT_TRUE(w.wait_version(v, 30s));
    EXPECT_TRUE(got == sent) << "version " << v;
  }
  EXPECT_EQ(t.write("layer.bias", bytes(sent.bias), 1s).code, refused);  // every version is out
}

// Checked here rather than by static_assert: std::string members keep the options from being
// constant expressions under clang with libstdc++ 12.
TEST(api, the_c_and_cpp_defaults_are_the_jobs) {
  const coordinator::options cpp;
  EXPECT_EQ(cpp.chunk_bytes, default_chunk_bytes);
  EXPECT_EQ(cpp.depth, default_depth);
  const ferry_coordinator_options c = FERRY_COORDINATOR_OPTIONS_INIT;
  EXPECT_EQ(c.chunk_bytes, default_chunk_bytes);
  EXPECT_EQ(c.depth, default_depth);
}

TEST(api, bad_input_is_refused_with_a_message_naming_it) {
  status ok;
  coordinator bad_listen({.listen = "carrier-pigeon://x", .secret = secret}, ok);
  EXPECT_EQ(ok.code, api_errc::invalid_argument);
  EXPECT_NE(ok.message.find("carrier-pigeon"), std::string::npos) << ok.message;

  EXPECT_EQ(set_log_level("loud").code, api_errc::invalid_argument);
  EXPECT_TRUE(set_log_level("info"));

  coordinator short_secret({.secret = "short"}, ok);
  EXPECT_EQ(ok.code, api_errc::invalid_argument);
  EXPECT_NE(ok.message.find("at least 16"), std::string::npos) << ok.message;

  coordinator bad_path({.secret = secret, .p2p = "nvlink"}, ok);
  EXPECT_EQ(ok.code, api_errc::invalid_argument);
  EXPECT_NE(ok.message.find("p2p 'nvlink': auto, device or host"), std::string::npos) << ok.message;
  ferry_coordinator_options c_options = FERRY_COORDINATOR_OPTIONS_INIT;
  const std::uint32_t one = 1;
  c_options.secret = secret;
  c_options.instance_sizes = &one;
  c_options.instances = 1;
  c_options.p2p = "nvlink";
  ferry_coordinator* c_coordinator = nullptr;
  EXPECT_NE(ferry_coordinator_open(&c_options, &c_coordinator), FERRY_OK);
  EXPECT_NE(std::string(ferry_last_error()).find("p2p 'nvlink'"), std::string::npos)
      << ferry_last_error();
  EXPECT_EQ(c_coordinator, nullptr);

  table x;
  trainer t({{.coordinator = "tcp://127.0.0.1:1", .secret = secret}});
  auto s = t.register_tensor({.name = "w", .dtype = "f33", .shape = {4}, .data = x.weight.data()});
  EXPECT_EQ(s.code, api_errc::invalid_argument);
  EXPECT_NE(s.message.find("'f33'"), std::string::npos) << s.message;
  s = t.register_tensor({.name = "w", .dtype = "f32", .shape = {4}, .data = nullptr});
  EXPECT_NE(s.message.find("null data"), std::string::npos) << s.message;
  s = t.publish(1);
  EXPECT_EQ(s.code, api_errc::not_joined);
  s = t.join();
  EXPECT_NE(s.message.find("no tensor"), std::string::npos) << s.message;
  ASSERT_TRUE(
      t.register_tensor({.name = "w", .dtype = "f32", .shape = {4}, .data = x.weight.data()}));
  s = t.register_tensor({.name = "w", .dtype = "f32", .shape = {4}, .data = x.weight.data()});
  EXPECT_NE(s.message.find("registered twice"), std::string::npos) << s.message;

  // Nothing listens at the coordinator's address: waits return at their timeout.
  ASSERT_TRUE(t.join());
  s = t.register_tensor({.name = "late", .dtype = "f32", .shape = {4}, .data = x.weight.data()});
  EXPECT_EQ(s.code, api_errc::already_joined);
  trainer::update u(nullptr);
  ASSERT_TRUE(t.publish(1, &u));
  EXPECT_EQ(t.publish(2).code, api_errc::busy);
  EXPECT_EQ(t.publish(1).code, api_errc::busy);
  EXPECT_EQ(u.wait_offloaded(300ms).code, api_errc::timed_out);
  t.close();
  EXPECT_EQ(u.wait_delivered(1s).code, api_errc::closed);
  EXPECT_EQ(t.publish(3).code, api_errc::closed);

  rollout r({{.coordinator = "tcp://127.0.0.1:1", .secret = secret}, 0, 0});
  EXPECT_EQ(r.wait_version(1, 10ms).code, api_errc::not_joined);
  rollout nameless({{.coordinator = "inproc://", .secret = secret}, 0, 0});
  ASSERT_TRUE(nameless.register_tensor({.name = "w", .dtype = "f32", .shape = {4}}));
  s = nameless.join();
  EXPECT_NE(s.message.find("needs a name"), std::string::npos) << s.message;

  // One member's tensors live on one device; a device tensor needs its pointer.
  trainer split({{.coordinator = "tcp://127.0.0.1:1", .secret = secret}});
  ASSERT_TRUE(
      split.register_tensor({.name = "a", .dtype = "f32", .shape = {4}, .data = x.weight.data()}));
  ASSERT_TRUE(split.register_tensor(
      {.name = "b", .dtype = "f32", .shape = {4}, .data = x.weight.data(), .device = 1}));
  s = split.join();
  EXPECT_EQ(s.code, api_errc::invalid_argument);
  EXPECT_NE(s.message.find("tensor 'a' is in host memory and tensor 'b' in device 1"),
            std::string::npos)
      << s.message;
  rollout device_without_data({{.coordinator = "tcp://127.0.0.1:1", .secret = secret}, 0, 0});
  s = device_without_data.register_tensor({.name = "w", .dtype = "f32", .shape = {4}, .device = 0});
  EXPECT_NE(s.message.find("null data"), std::string::npos) << s.message;
}

TEST(api, objects_of_one_process_share_an_inproc_job_by_name) {
  status ok;
  coordinator coord(
      {.listen = "inproc://api-test-job", .instance_sizes = {2}, .chunk_bytes = 64 * 1024}, ok);
  ASSERT_TRUE(ok) << ok.message;
  EXPECT_EQ(coord.address(), "inproc://api-test-job");
  coordinator twin({.listen = "inproc://api-test-job"}, ok);
  EXPECT_EQ(ok.code, api_errc::invalid_argument);
  EXPECT_NE(ok.message.find("already there"), std::string::npos) << ok.message;

  table sent;
  std::array<table, 2> got;
  trainer t({{.coordinator = coord.address()}});  // no secret: one process
  for (const auto& x : sent.tensors()) ASSERT_TRUE(t.register_tensor(x));
  std::vector<std::unique_ptr<rollout>> workers;
  for (std::uint32_t r = 0; r < 2; ++r) {
    workers.push_back(
        std::make_unique<rollout>(rollout::options{{.coordinator = coord.address()}, 0, r}));
    for (const auto& x : got[r].tensors()) ASSERT_TRUE(workers.back()->register_tensor(x));
  }
  ASSERT_TRUE(t.join());
  for (auto& w : workers) ASSERT_TRUE(w->join());
  ASSERT_TRUE(t.wait_ready(30s));
  EXPECT_EQ(t.next_version(), 1u);
  EXPECT_EQ(coord.next_version(), 1u);
  EXPECT_EQ(t.wait_end(10ms).code, api_errc::timed_out);
  for (std::uint64_t v = 1; v <= 2; ++v) {
    sent.fill(v);
    trainer::update u(nullptr);
    ASSERT_TRUE(t.publish(v, &u));
    const auto d = u.wait_delivered(30s);
    ASSERT_TRUE(d) << d.message;
    for (std::uint32_t r = 0; r < 2; ++r) {
      ASSERT_TRUE(workers[r]->wait_version(v, 30s));
      EXPECT_TRUE(got[r] == sent) << "worker " << r << " differs at version " << v;
    }
    EXPECT_EQ(coord.next_version(), v + 1);
  }
  // The coordinator ends the job: every member's wait_end returns, a wait for a version that
  // will not come says why, and nothing more is published.
  coord.close();
  const auto ended = t.wait_end(30s);
  EXPECT_TRUE(ended) << ended.message;
  for (auto& w : workers) {
    EXPECT_TRUE(w->wait_end(30s));
    const auto never = w->wait_version(3, 30s);
    EXPECT_EQ(never.code, api_errc::closed);
    EXPECT_NE(never.message.find("the job ended"), std::string::npos) << never.message;
  }
  EXPECT_EQ(t.publish(3).code, api_errc::closed);
}

TEST(api, a_rollout_whose_tensor_differs_from_the_trainers_fails_the_job_by_name) {
  status ok;
  coordinator coord(job({1}), ok);
  ASSERT_TRUE(ok) << ok.message;
  table sent, got;
  trainer t({{.coordinator = coord.address(), .secret = secret}});
  for (const auto& x : sent.tensors()) ASSERT_TRUE(t.register_tensor(x));
  rollout r({{.coordinator = coord.address(), .secret = secret}, 0, 0});
  auto tensors = got.tensors();
  tensors[1].shape = {2999};  // one element short of the trainer's layer.bias
  for (const auto& x : tensors) ASSERT_TRUE(r.register_tensor(x));
  ASSERT_TRUE(t.join());
  ASSERT_TRUE(r.join());
  // The job fails at the plan, which may come before or after the publish.
  trainer::update u(nullptr);
  auto d = t.publish(1, &u);
  if (d) d = u.wait_delivered(30s);
  EXPECT_EQ(d.code, api_errc::job_failed) << d.message;
  EXPECT_NE(d.message.find("layer.bias"), std::string::npos) << d.message;
  const auto w = r.wait_version(1, 30s);
  EXPECT_EQ(w.code, api_errc::job_failed) << w.message;
  const auto c = coord.wait_delivered(1, 30s);
  EXPECT_EQ(c.code, api_errc::job_failed) << c.message;
}

/// Sharded rollouts: a row range of `w` (rows of 132 bytes, cut across 1 KiB chunks), one expert
/// each, and `norm` on every worker. Each lands between canaries that must stay untouched.
struct sharded_table {
  static constexpr std::int64_t rows = 97, cols = 33, experts = 3;
  std::vector<float> w = std::vector<float>(rows * cols);
  std::array<std::vector<float>, experts> expert;
  std::vector<std::uint16_t> norm = std::vector<std::uint16_t>(40);
  sharded_table() {
    for (auto& e : expert) e.resize(300);
  }
  void fill(std::uint64_t version) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(version * 7919 + i);
    for (std::size_t e = 0; e < expert.size(); ++e) {
      for (std::size_t i = 0; i < expert[e].size(); ++i)
        expert[e][i] = static_cast<float>(version * 31 + e * 1000 + i);
    }
    for (std::size_t i = 0; i < norm.size(); ++i) norm[i] = static_cast<std::uint16_t>(version + i);
  }
  std::vector<tensor> tensors() {
    std::vector<tensor> out{{.name = "w", .dtype = "f32", .shape = {rows, cols}, .data = w.data()},
                            {.name = "norm", .dtype = "bf16", .shape = {40}, .data = norm.data()}};
    for (std::size_t e = 0; e < expert.size(); ++e) {
      out.push_back({.name = "expert." + std::to_string(e),
                     .dtype = "f32",
                     .shape = {300},
                     .data = expert[e].data()});
    }
    return out;
  }
};

/// Memory for one registered part, with canary bytes on both sides.
struct guarded {
  static constexpr std::size_t guard = 64;
  static constexpr std::byte canary{0xab};
  std::vector<std::byte> bytes;
  explicit guarded(std::size_t n) : bytes(n + 2 * guard, canary) {}
  void* data() { return bytes.data() + guard; }
  std::span<const std::byte> part() const {
    return {bytes.data() + guard, bytes.size() - 2 * guard};
  }
  bool canaries_intact() const {
    for (std::size_t i = 0; i < guard; ++i) {
      if (bytes[i] != canary || bytes[bytes.size() - 1 - i] != canary) return false;
    }
    return true;
  }
};

TEST(api, sharded_rollouts_receive_exactly_their_rows_and_experts) {
  status ok;
  auto o = job({3, 1});
  o.chunk_bytes = 1024;
  coordinator coord(o, ok);
  ASSERT_TRUE(ok) << ok.message;
  sharded_table sent;
  trainer t({{.coordinator = coord.address(), .secret = secret}});
  for (const auto& x : sent.tensors()) ASSERT_TRUE(t.register_tensor(x));

  // Instance 0: worker r holds rows [97 r / 3, 97 (r + 1) / 3) of w, expert r and norm. Instance 1:
  // one worker with the whole table.
  constexpr auto row_bytes = sharded_table::cols * sizeof(float);
  std::vector<std::unique_ptr<rollout>> workers;
  std::vector<std::map<std::string, guarded>> memory(3);
  std::vector<std::int64_t> first_row(3);
  std::mutex m;
  std::vector<std::map<std::string, std::size_t>> completed(3);  // on_tensor bytes per name
  for (std::uint32_t r = 0; r < 3; ++r) {
    workers.push_back(std::make_unique<rollout>(
        rollout::options{{.coordinator = coord.address(), .secret = secret}, 0, r}));
    auto& w = *workers.back();
    first_row[r] = sharded_table::rows * r / 3;
    const auto rows = sharded_table::rows * (r + 1) / 3 - first_row[r];
    auto& mine = memory[r];
    auto add = [&](const std::string& name, std::size_t bytes) {
      return mine.emplace(name, guarded(bytes)).first->second.data();
    };
    auto whole = sent.tensors();
    ASSERT_TRUE(w.register_rows({.name = "w",
                                 .dtype = "f32",
                                 .shape = {sharded_table::rows, sharded_table::cols},
                                 .data = add("w", rows * row_bytes)},
                                first_row[r], rows));
    ASSERT_TRUE(w.register_tensor(
        {.name = "norm", .dtype = "bf16", .shape = {40}, .data = add("norm", 80)}));
    const auto expert = "expert." + std::to_string(r);
    ASSERT_TRUE(w.register_tensor(
        {.name = expert, .dtype = "f32", .shape = {300}, .data = add(expert, 1200)}));
    w.on_tensor([&, r](std::uint64_t, const tensor& x, std::span<const std::byte> bytes) {
      std::lock_guard lock(m);
      completed[r][x.name] += bytes.size();
      if (x.name == "w") {
        EXPECT_EQ(x.shape[0] * static_cast<std::int64_t>(row_bytes),
                  static_cast<std::int64_t>(bytes.size()));
      }
    });
  }
  workers.push_back(std::make_unique<rollout>(
      rollout::options{{.coordinator = coord.address(), .secret = secret}, 1, 0}));
  ASSERT_TRUE(t.join());
  for (auto& w : workers) ASSERT_TRUE(w->join());

  for (const std::uint64_t v : {1, 2}) {
    sent.fill(v);
    trainer::update u(nullptr);
    ASSERT_TRUE(t.publish(v, &u));
    const auto d = u.wait_delivered(30s);
    ASSERT_TRUE(d) << d.message;
    for (auto& w : workers) ASSERT_TRUE(w->wait_version(v, 30s));
    for (std::uint32_t r = 0; r < 3; ++r) {
      const auto& mine = memory[r];
      const auto* rows_from =
          reinterpret_cast<const std::byte*>(sent.w.data()) + first_row[r] * row_bytes;
      const auto& w = mine.at("w");
      EXPECT_EQ(std::memcmp(w.part().data(), rows_from, w.part().size()), 0)
          << "worker " << r << " version " << v;
      EXPECT_EQ(std::memcmp(mine.at("norm").part().data(), sent.norm.data(), 80), 0);
      EXPECT_EQ(std::memcmp(mine.at("expert." + std::to_string(r)).part().data(),
                            sent.expert[r].data(), 1200),
                0);
      for (const auto& [name, g] : mine)
        EXPECT_TRUE(g.canaries_intact()) << "worker " << r << " wrote around '" << name << "'";
    }
  }
  std::lock_guard lock(m);
  for (std::uint32_t r = 0; r < 3; ++r) {
    // Each version's tensors, and only this worker's: two versions of each of its three parts.
    EXPECT_EQ(completed[r].size(), 3u);
    EXPECT_EQ(completed[r]["norm"], 2u * 80);
    EXPECT_EQ(completed[r]["expert." + std::to_string(r)], 2u * 1200);
  }
}

TEST(api, bad_shards_are_refused_before_any_byte_moves) {
  rollout early({{.coordinator = "tcp://127.0.0.1:1", .secret = secret}, 0, 0});
  const tensor w{.name = "w", .dtype = "f32", .shape = {97, 33}};
  auto s = early.register_rows(w, 90, 10);
  EXPECT_EQ(s.code, api_errc::invalid_argument);
  EXPECT_NE(s.message.find("rows [90, 100) lie outside its 97 rows"), std::string::npos)
      << s.message;
  EXPECT_EQ(early.register_rows(w, -1, 5).code, api_errc::invalid_argument);
  EXPECT_EQ(early.register_rows({.name = "scalar", .dtype = "f32", .shape = {}}, 0, 1).code,
            api_errc::invalid_argument);
  ASSERT_TRUE(early.register_rows(w, 0, 40));
  s = early.register_rows(w, 30, 20);
  EXPECT_NE(s.message.find("'w' registered twice (one row range per tensor)"), std::string::npos)
      << s.message;

  // Rows [40, 50) of w belong to no worker of the only instance; a tensor no trainer publishes.
  for (const auto& [rows, extra, expect] :
       {std::tuple{40, false, std::string("no worker registered bytes [5280, 6600) of tensor 'w'")},
        std::tuple{57, true, std::string("'ghost', which no trainer publishes")}}) {
    status ok;
    coordinator coord(job({2}), ok);
    ASSERT_TRUE(ok) << ok.message;
    sharded_table sent;
    trainer t({{.coordinator = coord.address(), .secret = secret}});
    ASSERT_TRUE(t.register_tensor(sent.tensors()[0]));
    rollout a({{.coordinator = coord.address(), .secret = secret}, 0, 0});
    rollout b({{.coordinator = coord.address(), .secret = secret}, 0, 1});
    ASSERT_TRUE(a.register_rows(w, 0, rows));
    ASSERT_TRUE(b.register_rows(w, 50, 47));
    if (extra) {
      ASSERT_TRUE(b.register_tensor({.name = "ghost", .dtype = "u8", .shape = {4}}));
    }
    ASSERT_TRUE(t.join());
    ASSERT_TRUE(a.join());
    ASSERT_TRUE(b.join());
    const auto c = coord.wait_delivered(1, 30s);
    EXPECT_EQ(c.code, api_errc::job_failed) << c.message;
    EXPECT_NE(c.message.find(expect), std::string::npos) << c.message;
    EXPECT_EQ(a.version(), 0u);
  }
}

/// A part no worker had registered joins a running job (an instance whose two workers split the
/// weight's rows): chunk ids now mean other bytes, so the versions in flight fail. A trainer that
/// publishes again at once must publish under the new layout: the job goes on, and every worker,
/// old and new, ends with the last version's bytes.
TEST(api, a_new_part_mid_job_changes_the_layout_and_the_trainer_goes_on_at_once) {
  status ok;
  coordinator coord(job({1}), ok);
  ASSERT_TRUE(ok) << ok.message;
  table sent, whole;
  trainer t({{.coordinator = coord.address(), .secret = secret}});
  for (const auto& x : sent.tensors()) ASSERT_TRUE(t.register_tensor(x));
  rollout first({{.coordinator = coord.address(), .secret = secret}, 0, 0});
  for (const auto& x : whole.tensors()) ASSERT_TRUE(first.register_tensor(x));
  ASSERT_TRUE(t.join());
  ASSERT_TRUE(first.join());

  // The trainer publishes back to back; a failed version is followed at once by the next.
  std::atomic<std::uint64_t> delivered{0};
  std::atomic<bool> stop{false};
  std::string trainer_error;
  std::thread publisher([&] {
    for (std::uint64_t v = 1; !stop; ++v) {
      sent.fill(v);
      trainer::update u(nullptr);
      if (auto s = t.publish(v, &u); !s) return void(trainer_error = s.message);
      const auto d = u.wait_delivered(30s);
      if (d)
        delivered = v;
      else if (d.code != api_errc::update_failed)
        return void(trainer_error = d.message);
    }
  });
  auto wait_for_delivered = [&](std::uint64_t at_least) {
    for (int i = 0; i < 3000 && delivered < at_least && trainer_error.empty(); ++i)
      std::this_thread::sleep_for(10ms);
    return delivered >= at_least;
  };
  ASSERT_TRUE(wait_for_delivered(2)) << trainer_error;

  // Instance 1: rows [0, 48) and [48, 96) of the weight on two workers, the bias on both.
  constexpr std::int64_t half = 48;
  std::array<std::vector<float>, 2> rows{std::vector<float>(half * 1024),
                                         std::vector<float>(half * 1024)};
  std::array<std::vector<std::uint16_t>, 2> bias{std::vector<std::uint16_t>(3000),
                                                 std::vector<std::uint16_t>(3000)};
  std::vector<std::unique_ptr<rollout>> split;
  for (std::uint32_t r = 0; r < 2; ++r) {
    split.push_back(std::make_unique<rollout>(
        rollout::options{{.coordinator = coord.address(), .secret = secret}, 1, r}));
    ASSERT_TRUE(split[r]->register_rows(
        {.name = "layer.weight", .dtype = "f32", .shape = {96, 1024}, .data = rows[r].data()},
        r * half, half));
    ASSERT_TRUE(split[r]->register_tensor(
        {.name = "layer.bias", .dtype = "bf16", .shape = {3000}, .data = bias[r].data()}));
    ASSERT_TRUE(split[r]->join());
  }
  const auto joined_at = delivered.load();
  ASSERT_TRUE(wait_for_delivered(joined_at + 3))
      << "no version delivered after the layout changed: " << trainer_error;
  stop = true;
  publisher.join();
  ASSERT_TRUE(trainer_error.empty()) << trainer_error;

  const auto last = delivered.load();
  table want;
  want.fill(last);
  ASSERT_TRUE(first.wait_version(last, 30s));
  EXPECT_TRUE(whole == want) << "the first worker differs from version " << last;
  for (std::uint32_t r = 0; r < 2; ++r) {
    ASSERT_TRUE(split[r]->wait_version(last, 30s));
    EXPECT_EQ(std::memcmp(rows[r].data(), want.weight.data() + r * half * 1024,
                          rows[r].size() * sizeof(float)),
              0)
        << "worker 1." << r << "'s rows differ from version " << last;
    EXPECT_EQ(bias[r], want.bias) << "worker 1." << r;
  }
}

}  // namespace
}  // namespace ferry
