#include "runtime/virtual_environment.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "runtime/await.hpp"
#include "runtime/transport.hpp"
#include "transport/factory.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;

TEST(virtual_environment, an_hour_of_timers_passes_at_once_and_in_order) {
  event_loop loop;
  virtual_environment env(loop);
  std::vector<int> order;
  loop.spawn([&] {
    env.clock().sleep_for(1h);
    order.push_back(2);
  });
  loop.spawn([&] {
    env.clock().sleep_for(30min);
    order.push_back(1);
  });
  const auto wall = std::chrono::steady_clock::now();
  loop.run_until([&] { return order.size() == 2; });
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_EQ(env.clock().now().time_since_epoch(), std::chrono::duration_cast<clock::duration>(1h));
  EXPECT_LT(std::chrono::steady_clock::now() - wall,
            10s);  // a bound against a blocking sleep, not a benchmark
}

TEST(virtual_environment, work_runs_inline_and_completes_after_its_modelled_cost) {
  event_loop loop;
  virtual_environment env(loop, {.bytes_per_second = 1e9, .latency = 1us, .parallelism = 2});
  int value = 0;
  clock::time_point done_at{};
  loop.spawn([&] {
    env.cpu().run(1'000'000, [&] { value = 42; });  // 1 MB at 1 GB/s: 1 ms, plus 1 us
    done_at = env.clock().now();
  });
  loop.run_until([&] { return done_at != clock::time_point{}; });
  EXPECT_EQ(value, 42);
  EXPECT_EQ(done_at.time_since_epoch(), 1ms + 1us);
}

TEST(virtual_environment, copies_move_the_bytes) {
  event_loop loop;
  virtual_environment env(loop);
  std::vector<std::byte> src(1 << 20), dst(1 << 20);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 7);
  bool finished = false;
  env.copies().async_copy({{dst.data(), src.data(), src.size()}}, [&](std::error_code ec) {
    EXPECT_FALSE(ec);
    finished = true;
  });
  loop.run_until([&] { return finished; });
  EXPECT_EQ(src, dst);
}

TEST(virtual_environment, a_loop_with_nothing_left_to_happen_stalls_instead_of_blocking) {
  event_loop loop;
  virtual_environment env(loop);
  bool never = false;
  slot_counter none(0);
  loop.spawn([&] {
    none.acquire();  // nobody will ever release it
    never = true;
  });
  loop.run_until([&] { return never; });
  EXPECT_TRUE(loop.stalled());
  EXPECT_FALSE(never);
  none.release();  // let the fiber end before the loop goes
  loop.run_until([&] { return never; });
}

TEST(virtual_environment, real_transports_are_refused_and_inproc_is_not) {
  event_loop loop;
  virtual_environment env(loop);
  transport_settings settings;
  settings.allow_unauthenticated = true;
  EXPECT_FALSE(make_transport("tcp", env, 1, settings).has_value());
  EXPECT_FALSE(make_transport("fabric", env, 1, settings).has_value());
  EXPECT_TRUE(make_transport("inproc", env, 1, settings).has_value());
}

TEST(virtual_environment, blocking_calls_are_refused) {
  event_loop loop;
  virtual_environment env(loop);
  std::optional<std::error_code> result;
  bool ran = false;
  env.platform().async_blocking(
      [&] {
        ran = true;
        return std::error_code{};
      },
      [&](std::error_code ec) { result = ec; });
  loop.run_until([&] { return result.has_value(); });
  EXPECT_FALSE(ran);
  EXPECT_EQ(*result, make_error_code(errc::invalid_argument));
}

TEST(trace, the_digest_depends_on_every_record_and_its_order) {
  trace a, b, c;
  const trace_record one{.node = 1,
                         .what = stage::send,
                         .version = 2,
                         .chunk = 3,
                         .bytes = 4,
                         .start_ns = 5,
                         .end_ns = 6};
  const trace_record two{.node = 1,
                         .what = stage::apply,
                         .version = 2,
                         .chunk = 3,
                         .bytes = 4,
                         .start_ns = 6,
                         .end_ns = 9};
  a.record(one);
  a.record(two);
  b.record(one);
  b.record(two);
  c.record(two);
  c.record(one);
  EXPECT_EQ(a.digest(), b.digest());
  EXPECT_NE(a.digest(), c.digest());
  EXPECT_EQ(a.count(), 2u);
}

TEST(trace, chrome_json_has_a_track_per_node_and_stage) {
  trace t;
  t.keep_records();
  t.record({.node = 3,
            .what = stage::broadcast,
            .version = 1,
            .chunk = 7,
            .bytes = 4096,
            .start_ns = 1000,
            .end_ns = 3000});
  t.record({.node = 0,
            .instant = true,
            .start_ns = 2000,
            .end_ns = 2000,
            .label = "kill \"worker\" 0.1"});
  const std::string path = ::testing::TempDir() + "ferry_trace_test.json";
  ASSERT_FALSE(t.write_chrome(path));
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  const auto json = text.str();
  EXPECT_NE(
      json.find(
          R"("ph":"X","name":"broadcast v1 c7","cat":"broadcast","pid":3,"tid":3,"ts":1.000,"dur":2.000)"),
      std::string::npos)
      << json;
  EXPECT_NE(json.find(R"("name":"kill \"worker\" 0.1")"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("name":"thread_name","pid":3,"tid":3,"args":{"name":"broadcast"})"),
            std::string::npos);
  std::remove(path.c_str());
  EXPECT_TRUE(t.write_chrome("/nonexistent-dir/trace.json"));
}

}  // namespace
}  // namespace ferry
