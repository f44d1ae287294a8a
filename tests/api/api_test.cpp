#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <mutex>

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
}

TEST(api, objects_of_one_process_share_an_inproc_job_by_name) {
  status ok;
  coordinator coord({.listen = "inproc://api-test-job", .instance_sizes = {2}, .chunk_bytes = 64 * 1024},
                    ok);
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
    workers.push_back(std::make_unique<rollout>(rollout::options{{.coordinator = coord.address()}, 0, r}));
    for (const auto& x : got[r].tensors()) ASSERT_TRUE(workers.back()->register_tensor(x));
  }
  ASSERT_TRUE(t.join());
  for (auto& w : workers) ASSERT_TRUE(w->join());
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
  }
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
  trainer::update u(nullptr);
  ASSERT_TRUE(t.publish(1, &u));
  const auto d = u.wait_delivered(30s);
  EXPECT_EQ(d.code, api_errc::job_failed) << d.message;
  EXPECT_NE(d.message.find("layer.bias"), std::string::npos) << d.message;
  const auto w = r.wait_version(1, 30s);
  EXPECT_EQ(w.code, api_errc::job_failed) << w.message;
  const auto c = coord.wait_delivered(1, 30s);
  EXPECT_EQ(c.code, api_errc::job_failed) << c.message;
}

}  // namespace
}  // namespace ferry
