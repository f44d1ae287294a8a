/// Every configurable limit on what peers announce: each is enforced, and each refusal names the
/// limit and the value that broke it.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <boost/asio/read.hpp>
#include <thread>

#include "actors/coordinator.hpp"
#include "actors/plan.hpp"
#include "platform/real_environment.hpp"
#include "protocol/protocol.hpp"
#include "runtime/codec.hpp"
#include "runtime/messages.hpp"
#include "runtime/node.hpp"
#include "transport/errc.hpp"
#include "transport/inproc/inproc_transport.hpp"
#include "transport/tcp/link_protocol.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace ferry {
namespace {

std::vector<tensor_spec> tensors(std::size_t n, std::size_t name_bytes = 8,
                                 std::int64_t elems = 64) {
  std::vector<tensor_spec> v;
  for (std::size_t i = 0; i < n; ++i) {
    auto name = std::to_string(i);
    name.resize(std::max(name.size(), name_bytes), 'x');
    v.push_back(make_tensor_spec(name, dtype::u8, {elems}));
  }
  return v;
}

plan_inputs inputs(std::vector<std::vector<tensor_spec>> shards, job_limits limits) {
  plan_inputs in{.chunk_bytes = 1024, .limits = limits};
  for (std::uint32_t s = 0; s < shards.size(); ++s) in.shards.push_back({s + 1, 1});
  in.shard_tensors = std::move(shards);
  in.instances = {{.id = 0, .workers = {{10, 1}}}};
  return in;
}

TEST(job_limits, tensor_count_is_capped_per_registration_and_per_plan) {
  std::string why;
  EXPECT_TRUE(make_plan(inputs({tensors(4)}, {.max_tensors = 4}), why)) << why;
  EXPECT_FALSE(make_plan(inputs({tensors(5)}, {.max_tensors = 4}), why));
  EXPECT_EQ(why, "max_tensors: 5 tensors registered, the limit is 4");
  // Two shards of 3 each: every registration is under the cap, the plan is not.
  auto second = tensors(3);
  for (auto& t : second) t.name = "b" + t.name;
  EXPECT_FALSE(make_plan(inputs({tensors(3), second}, {.max_tensors = 4}), why));
  EXPECT_EQ(why, "max_tensors: the plan has 6 tensors, the limit is 4");
}

TEST(job_limits, tensor_name_length_is_capped) {
  std::string why;
  EXPECT_TRUE(check_registration(tensors(2, 16), {.max_tensor_name_bytes = 16}, why)) << why;
  EXPECT_FALSE(check_registration(tensors(2, 17), {.max_tensor_name_bytes = 16}, why));
  EXPECT_NE(why.find("max_tensor_name_bytes: a tensor name of 17 bytes"), std::string::npos) << why;
  EXPECT_NE(why.find("the limit is 16"), std::string::npos) << why;
  EXPECT_FALSE(make_plan(inputs({tensors(1, 2000)}, {}), why));
  EXPECT_NE(why.find("max_tensor_name_bytes: a tensor name of 2000 bytes"), std::string::npos)
      << why;
}

TEST(job_limits, chunk_count_is_capped_before_any_chunk_is_made) {
  std::string why;
  // 4 tensors of 1000 bytes, 256-aligned: a 4 KiB stream, 4 chunks of 1 KiB.
  EXPECT_TRUE(make_plan(inputs({tensors(4, 8, 1000)}, {.max_chunks = 4}), why)) << why;
  EXPECT_FALSE(make_plan(inputs({tensors(5, 8, 1000)}, {.max_chunks = 4}), why));
  EXPECT_EQ(why, "max_chunks: the plan needs 5 chunks of 1024 bytes, the limit is 4");
  // A lying size: 2^62 bytes would be 2^52 chunks; refused from arithmetic, not by allocating.
  auto huge = tensors(1);
  huge[0].shape = {std::int64_t{1} << 62};
  huge[0].nbytes = std::uint64_t{1} << 62;
  EXPECT_FALSE(make_plan(inputs({huge}, {}), why));
  EXPECT_NE(why.find("max_chunks: the plan needs 4503599627370496 chunks"), std::string::npos)
      << why;
}

TEST(job_limits, regions_per_peer_are_capped_per_epoch) {
  region_budget budget;
  std::string why;
  const job_limits limits{.max_regions_per_peer = 2};
  auto region = [](std::uint64_t id) { return region_desc{.owner = 7, .id = id, .length = 64}; };
  EXPECT_TRUE(budget.offer(7, 1, region(1), limits, why));
  EXPECT_TRUE(budget.offer(7, 1, region(1), limits, why));  // the same region again is no new one
  EXPECT_TRUE(budget.offer(7, 1, region(2), limits, why));
  EXPECT_TRUE(budget.offer(8, 1, region(3), limits, why));  // another peer has its own budget
  EXPECT_FALSE(budget.offer(7, 1, region(3), limits, why));
  EXPECT_EQ(why, "max_regions_per_peer: node 7 offered 3 regions in epoch 1, the limit is 2");
  EXPECT_TRUE(budget.offer(7, 2, region(4), limits, why));  // a new plan, fresh staging
}

TEST(job_limits, frame_size_is_capped_at_the_configured_bytes) {
  codec_limits limits;
  limits.max_frame_bytes = 1024;
  message_registry registry;
  register_runtime_messages(registry);
  auto frame_of = [](std::size_t payload) {
    return encode(envelope_header{}, ping{.nonce = 1, .payload = std::string(payload, 'p')});
  };
  // Find the payload that makes the envelope exactly 1024 bytes.
  const std::size_t overhead = frame_of(0).size() - frame_prefix_bytes;
  std::size_t fill = 1024 - overhead;
  auto exact = frame_of(fill);
  while (exact.size() - frame_prefix_bytes > 1024) exact = frame_of(--fill);  // str headers grow
  ASSERT_EQ(exact.size() - frame_prefix_bytes, 1024u);
  EXPECT_TRUE(decode_frame(exact, registry, limits));
  const auto over = frame_of(fill + 1);
  ASSERT_EQ(over.size() - frame_prefix_bytes, 1025u);
  EXPECT_EQ(decode_frame(over, registry, limits).error(), errc::oversize_frame);
  EXPECT_EQ(decode_prefix(over, limits).error(), errc::oversize_frame);
  EXPECT_EQ(decode_payload(std::span(over).subspan(frame_prefix_bytes), registry, limits).error(),
            errc::oversize_frame);
}

/// A coordinator with tight limits fails the job, naming the limit, when a trainer registers
/// past one; the registration's tensors never reach a plan.
TEST(job_limits, coordinator_refuses_a_registration_past_a_limit) {
  event_loop loop;
  real_environment env{loop};
  inproc_network network;
  node hub{env, 0, inproc_transport::make(env, network, 0), protocol()};
  node trainer{env, 1, inproc_transport::make(env, network, 1), protocol()};
  ASSERT_FALSE(hub.start());
  ASSERT_FALSE(trainer.start());
  job_shape shape{.trainers = 1, .instance_sizes = {1}, .chunk_bytes = 1024};
  shape.limits.max_tensor_name_bytes = 32;
  job_coordinator coord(hub, 1, shape);
  std::string failure;
  coord.on_failed = [&](const std::string& why) { failure = why; };
  coord.start();
  actor shard(trainer, 1);
  shard.start();
  shard.send({0, 1}, register_trainer{.shard = 0,
                                      .transport_address = trainer.transport().local_address(),
                                      .tensors = tensors(3, 40)});
  loop.run_until([&] { return !failure.empty(); });
  EXPECT_NE(
      failure.find("trainer shard 0 (node 1): max_tensor_name_bytes: a tensor name of 40 bytes"),
      std::string::npos)
      << failure;
  EXPECT_FALSE(coord.current_plan());
}

/// tcp: connections from one address are capped (max_connections_per_address); the refused one
/// gets REFUSE(limit_exceeded) before any handshake; the others are left alone.
TEST(job_limits, tcp_connections_per_address_are_capped) {
  event_loop loop;
  tcp_options o;
  o.secret = job_secret(32, std::byte{'k'});
  o.max_connections_per_address = 2;
  auto server = tcp_transport::make(loop, 5, o);
  ASSERT_FALSE(server->start({}));
  const auto address = server->local_address();
  const auto port = static_cast<std::uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));

  std::atomic<bool> done = false;
  std::array<bool, 3> refused{};
  std::thread client([&] {
    namespace asio = boost::asio;
    asio::io_context io;
    std::vector<asio::ip::tcp::socket> sockets;
    for (int i = 0; i < 3; ++i) {
      sockets.emplace_back(io).connect({asio::ip::make_address("127.0.0.1"), port});
      timeval tv{.tv_sec = 5, .tv_usec = 0};
      ::setsockopt(sockets.back().native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    // The third is refused at once; the first two wait for a HELLO and are sent nothing.
    std::array<std::byte, tcp_link::head_bytes + tcp_link::refuse_bytes> f{};
    boost::system::error_code ec;
    asio::read(sockets[2], asio::buffer(f), ec);
    const auto head = tcp_link::parse_head(std::span(f).first<tcp_link::head_bytes>());
    const auto reason = tcp_link::parse_refuse(std::span(f).subspan(tcp_link::head_bytes));
    refused[2] = !ec && head &&
                 head->type == static_cast<std::uint8_t>(tcp_link::frame_type::refuse) && reason &&
                 *reason == static_cast<std::uint16_t>(transport_errc::limit_exceeded);
    for (int i = 0; i < 2; ++i) refused[i] = sockets[i].available(ec) > 0;
    done = true;
  });
  loop.run_until([&] { return done.load(); });
  client.join();
  EXPECT_TRUE(refused[2]);
  EXPECT_FALSE(refused[0]);
  EXPECT_FALSE(refused[1]);
  EXPECT_EQ(server->stats().connections_refused, 1u);
  server->close();
}

}  // namespace
}  // namespace ferry
