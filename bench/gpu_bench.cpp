/// ferry_gpu_bench: each stage of a GPU weight update measured alone, one process per GPU, the
/// same primitives the job uses (cuda_copy_engine, the transport's bulk writes, nccl_broadcast).
/// bench/gpu_bench.py drives it and the whole-update jobs, and writes bench/results/gpu.md.
///   copy DEVICE BYTES CHUNK DEPTH                     D2H then H2D, pinned host ring
///   host-offload BYTES CHUNK DEPTH                    a host trainer's offload: memcpy from its
///                                                    tensors into its host copy, on the pool
///   p2p-recv DIR SENDERS BYTES CHUNK DEPTH SCHEME [PROVIDER]   the leader's receive slots
///   p2p-send DIR INDEX SENDERS BYTES CHUNK DEPTH SCHEME [PROVIDER]   one trainer's writes
///   bcast DIR RANK RANKS DEVICE BYTES CHUNK DEPTH [STRIPES]   one member of the instance
///                                                    broadcast, or of the all-gather of STRIPES
///   peer-export DIR DEVICE BYTES                      device memory shared with another process
///                                                    (what a trainer's device copies are), a
///                                                    pattern in it, until peer-copy is done
///   peer-copy DIR DEVICE BYTES CHUNK DEPTH [kill-owner]   maps peer-export's memory and copies
///                                                    it into its own GPU, chunk by chunk (the
///                                                    plain peer copy device-direct is judged
///                                                    against), then the same bytes inside its own
///                                                    GPU; with kill-owner, SIGKILLs peer-export
///                                                    first: the mapping must still hold its bytes
/// Each prints one JSON line on stdout.
#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "actors/messages.hpp"
#include "collectives/nccl/nccl_broadcast.hpp"
#include "platform/cuda/cuda_copy_engine.hpp"
#include "platform/cuda/cuda_device_memory.hpp"
#include "platform/cuda/cuda_error.hpp"
#include "platform/cuda/cuda_shared_memory.hpp"
#include "platform/real_environment.hpp"
#include "protocol/protocol.hpp"
#include "runtime/host_buffer.hpp"
#include "runtime/node.hpp"
#include "transport/factory.hpp"

namespace ferry {
namespace {

using steady = std::chrono::steady_clock;
constexpr std::uint8_t bench_tag = 9;

double now_s() {
  return std::chrono::duration<double>(steady::now().time_since_epoch()).count();
}

void wait_for_file(const std::filesystem::path& p) {
  while (!std::filesystem::exists(p)) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  const auto tmp = p.string() + ".tmp";
  std::ofstream(tmp) << text;
  std::filesystem::rename(tmp, p);
}

/// Keeps `depth` operations in flight until `count` were issued; `issue(i, done)` starts one.
void pipeline(event_loop& loop, std::uint64_t count, std::uint32_t depth,
              const std::function<void(std::uint64_t, std::function<void(std::error_code)>)>& issue,
              std::error_code& failure) {
  std::uint64_t next = 0, finished = 0;
  std::function<void()> more = [&] {
    while (next < count && next - finished < depth && !failure) {
      issue(next++, [&](std::error_code ec) {
        if (ec && !failure) failure = ec;
        ++finished;
        more();
      });
    }
  };
  more();
  loop.run_until([&] { return finished == next && (next == count || failure); });
}

int copy_stage(int device, std::uint64_t bytes, std::uint64_t chunk, std::uint32_t depth) {
  event_loop loop;
  cuda_device_memory memory(device);
  auto engine = cuda_copy_engine::make(loop, device);
  if (!engine) return std::fprintf(stderr, "copy: %s\n", engine.error().message().c_str()), 1;
  host_buffer ring(std::size_t{depth} * chunk);
  if (auto ec = memory.pin(ring.span()))
    return std::fprintf(stderr, "pin: %s\n", ec.message().c_str()), 1;
  auto dev = memory.allocate(std::size_t{depth} * chunk);
  if (!dev) return std::fprintf(stderr, "alloc: %s\n", dev.error().message().c_str()), 1;
  std::error_code failure;
  auto run = [&](bool to_host, std::uint64_t n) {
    pipeline(
        loop, n, depth,
        [&](std::uint64_t i, auto done) {
          std::byte* h = ring.data() + (i % depth) * chunk;
          std::byte* d = *dev + (i % depth) * chunk;
          (*engine)->async_copy({to_host ? copy_piece{h, d, chunk} : copy_piece{d, h, chunk}},
                                std::move(done));
        },
        failure);
  };
  const std::uint64_t n = bytes / chunk;
  run(true, 8);
  const double d0 = now_s();
  run(true, n);
  const double d1 = now_s();
  run(false, 8);
  const double h0 = now_s();
  run(false, n);
  const double h1 = now_s();
  if (failure) return std::fprintf(stderr, "copy: %s\n", failure.message().c_str()), 1;
  std::printf(
      "{\"stage\":\"copy\",\"device\":%d,\"bytes\":%llu,\"d2h_start\":%.6f,\"d2h_end\":%.6f,\"h2d_"
      "start\":%.6f,"
      "\"h2d_end\":%.6f}\n",
      device, static_cast<unsigned long long>(n * chunk), d0, d1, h0, h1);
  memory.release(*dev);
  memory.unpin(ring.span());
  return 0;
}

int host_offload_stage(std::uint64_t bytes, std::uint64_t chunk, std::uint32_t depth) {
  event_loop loop;
  real_environment environment(loop);
  auto& engine = environment.copies();
  const std::uint64_t n = bytes / chunk;
  host_buffer tensors(n * chunk), copy(n * chunk);  // both faulted in, as in the job
  std::error_code failure;
  const double t0 = now_s();
  pipeline(
      loop, n, depth,
      [&](std::uint64_t i, auto done) {
        engine.async_copy({{copy.data() + i * chunk, tensors.data() + i * chunk, chunk}},
                          std::move(done));
      },
      failure);
  const double t1 = now_s();
  if (failure) return std::fprintf(stderr, "host-offload: %s\n", failure.message().c_str()), 1;
  std::printf("{\"stage\":\"host-offload\",\"bytes\":%llu,\"start\":%.6f,\"end\":%.6f}\n",
              static_cast<unsigned long long>(n * chunk), t0, t1);
  return 0;
}

result<std::shared_ptr<transport>> open_transport(environment& host, node_id id,
                                                  const std::string& scheme,
                                                  const std::string& provider,
                                                  transport_settings& env) {
  env.allow_unauthenticated = true;
  env.fabric_provider = provider;
  return make_transport(scheme, host, id, env);
}

int p2p_recv(const std::filesystem::path& dir, std::uint32_t senders, std::uint64_t bytes,
             std::uint64_t chunk, std::uint32_t depth, const std::string& scheme,
             const std::string& provider) {
  event_loop loop;
  real_environment environment(loop);
  transport_settings env;
  auto t = open_transport(environment, 0, scheme, provider, env);
  if (!t) return std::fprintf(stderr, "p2p-recv: %s\n", t.error().message().c_str()), 1;
  node n(environment, 0, *t, protocol());
  if (auto ec = n.start()) return std::fprintf(stderr, "p2p-recv: %s\n", ec.message().c_str()), 1;
  host_buffer slots(std::size_t{senders} * depth * chunk);
  auto region = n.transport().register_region(slots.span());
  if (!region) return std::fprintf(stderr, "p2p-recv: %s\n", region.error().message().c_str()), 1;
  const std::uint64_t timed_per_sender = bytes / senders / chunk;
  std::uint64_t timed = 0;
  double t0 = 0, t1 = 0;
  n.on_write(bench_tag, [&](const write_notice& w) {
    if ((imm_value(w.imm) >> 23) == 0) return;  // warm-up
    if (timed++ == 0) t0 = now_s();
    if (timed == timed_per_sender * senders) t1 = now_s();
  });
  write_file(dir / "recv",
             fmt::format("{}\n{} {} {} {} {}\n", n.transport().local_address(), region->owner,
                         region->id, region->addr, region->key, region->length));
  loop.run_until([&] { return timed == timed_per_sender * senders; });
  // First to last arrival spans all but one chunk: count the bytes of the others.
  std::printf(
      "{\"stage\":\"p2p\",\"scheme\":\"%s\",\"provider\":\"%s\",\"senders\":%u,\"bytes\":%llu,"
      "\"seconds\":%.6f,\"start\":%.6f,\"end\":%.6f}\n",
      scheme.c_str(), provider.c_str(), senders,
      static_cast<unsigned long long>((timed - 1) * chunk), t1 - t0, t0, t1);
  write_file(dir / "recv.done", "1\n");
  return 0;
}

int p2p_send(const std::filesystem::path& dir, std::uint32_t index, std::uint32_t senders,
             std::uint64_t bytes, std::uint64_t chunk, std::uint32_t depth,
             const std::string& scheme, const std::string& provider) {
  event_loop loop;
  real_environment environment(loop);
  transport_settings env;
  auto t = open_transport(environment, 1 + index, scheme, provider, env);
  if (!t) return std::fprintf(stderr, "p2p-send: %s\n", t.error().message().c_str()), 1;
  node n(environment, 1 + index, *t, protocol());
  if (auto ec = n.start()) return std::fprintf(stderr, "p2p-send: %s\n", ec.message().c_str()), 1;
  wait_for_file(dir / "recv");
  std::ifstream in(dir / "recv");
  std::string address;
  region_desc remote;
  in >> address >> remote.owner >> remote.id >> remote.addr >> remote.key >> remote.length;
  if (auto ec = n.transport().add_peer(0, address))
    return std::fprintf(stderr, "p2p-send: %s\n", ec.message().c_str()), 1;
  host_buffer source(std::size_t{depth} * chunk);
  for (std::size_t i = 0; i < source.size(); i += 4096)
    source.data()[i] = static_cast<std::byte>(i >> 12);
  if (auto r = n.transport().register_region(source.span()); !r)
    return std::fprintf(stderr, "p2p-send: register\n"), 1;
  std::error_code failure;
  auto run = [&](bool timed, std::uint64_t count) {
    pipeline(
        loop, count, depth,
        [&](std::uint64_t i, auto done) {
          const std::uint64_t slot = std::uint64_t{index} * depth + i % depth;
          n.transport().async_write(
              {source.data() + (i % depth) * chunk, chunk}, remote, slot * chunk,
              make_imm(bench_tag, (timed ? 1u << 23 : 0u) | (i & 0xffff)), std::move(done));
        },
        failure);
  };
  run(false, 8);
  run(true, bytes / senders / chunk);
  if (failure) return std::fprintf(stderr, "p2p-send: %s\n", failure.message().c_str()), 1;
  wait_for_file(dir / "recv.done");
  return 0;
}

int bcast_rank(const std::filesystem::path& dir, std::uint32_t rank, std::uint32_t ranks,
               int device, std::uint64_t bytes, std::uint64_t chunk, std::uint32_t depth,
               std::uint32_t stripes) {
  event_loop loop;
  real_environment environment(loop);
  transport_settings env;
  auto t = open_transport(environment, rank + 1, "tcp", "", env);
  if (!t) return std::fprintf(stderr, "bcast: %s\n", t.error().message().c_str()), 1;
  node n(environment, rank + 1, *t, protocol());
  if (auto ec = n.start()) return std::fprintf(stderr, "bcast: %s\n", ec.message().c_str()), 1;
  write_file(dir / fmt::format("rank.{}", rank), n.transport().local_address() + "\n");
  std::vector<address> members;
  for (std::uint32_t r = 0; r < ranks; ++r) {
    members.push_back({r + 1, 1});
    if (r == rank) continue;
    wait_for_file(dir / fmt::format("rank.{}", r));
    std::string a;
    std::ifstream(dir / fmt::format("rank.{}", r)) >> a;
    (void)n.transport().add_peer(r + 1, a);
  }
  actor a(n, 1);
  a.start();
  cuda_device_memory memory(device);
  auto ring = memory.allocate(std::size_t{depth} * chunk);
  if (!ring) return std::fprintf(stderr, "bcast: %s\n", ring.error().message().c_str()), 1;
  double t0 = 0, t1 = 0, init = 0;
  std::error_code failure;
  {
    nccl_broadcast group(a, members, 1, device);
    auto run = [&](std::uint64_t count) {
      pipeline(
          loop, count, depth,
          [&](std::uint64_t i, auto done) {
            const buffer_ref slot{.bytes = {*ring + (i % depth) * chunk, chunk}, .device = device};
            if (stripes > 1)
              group.async_all_gather(slot, stripes, std::move(done));
            else
              group.async_broadcast(slot, std::move(done));
          },
          failure);
    };
    const double i0 = now_s();
    run(4);  // includes creating the communicator
    init = now_s() - i0;
    t0 = now_s();
    run(bytes / chunk);
    t1 = now_s();
    write_file(dir / fmt::format("done.{}", rank), "1\n");
    for (std::uint32_t r = 0; r < ranks; ++r) wait_for_file(dir / fmt::format("done.{}", r));
  }
  if (failure) return std::fprintf(stderr, "bcast: %s\n", failure.message().c_str()), 1;
  std::printf(
      "{\"stage\":\"broadcast\",\"stripes\":%u,\"rank\":%u,\"ranks\":%u,\"device\":%d,\"bytes\":%"
      "llu,"
      "\"start\":%.6f,\"end\":%.6f,\"first_seconds\":%.6f}\n",
      stripes, rank, ranks, device, static_cast<unsigned long long>(bytes / chunk * chunk), t0, t1,
      init);
  a.stop();
  loop.run_until([&] { return a.finished(); });
  memory.release(*ring);
  return 0;
}

/// The byte at `offset` of peer-export's pattern.
std::byte pattern_at(std::uint64_t offset) {
  return static_cast<std::byte>((offset * 7 + offset / 4093) & 0xff);
}

int peer_export(const std::filesystem::path& dir, int device, std::uint64_t bytes) {
  std::string why;
  auto shared = cuda_allocate_shared(device, bytes, why);
  if (!shared) return std::fprintf(stderr, "peer-export: %s\n", why.c_str()), 1;
  constexpr std::uint64_t piece = 64ull << 20;
  host_buffer pattern(piece);
  for (std::uint64_t at = 0; at < bytes; at += piece) {
    const auto n = std::min(piece, bytes - at);
    for (std::uint64_t i = 0; i < n; ++i) pattern.data()[i] = pattern_at(at + i);
    if (auto ec = cuda_copy_blocking((*shared)->bytes().data() + at, pattern.data(), n))
      return std::fprintf(stderr, "peer-export: %s\n", ec.message().c_str()), 1;
  }
  const auto r = (*shared)->ref();
  write_file(dir / "ref", fmt::format("{} {} {} {} {}\n", r.pid, r.fd, r.inode, r.host, r.bytes));
  wait_for_file(dir / "done");
  return 0;
}

/// Whether process `pid` has exited (gone, or a zombie whose memory and files are released).
bool exited(std::int32_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  return !std::getline(stat, line) || line.find(") Z ") != std::string::npos;
}

int peer_copy(const std::filesystem::path& dir, int device, std::uint64_t bytes,
              std::uint64_t chunk, std::uint32_t depth, bool kill_owner) {
  wait_for_file(dir / "ref");
  shared_device_ref ref;
  std::ifstream(dir / "ref") >> ref.pid >> ref.fd >> ref.inode >> ref.host >> ref.bytes;
  std::string why;
  auto peer = cuda_map_shared(device, ref, why);
  if (!peer) return std::fprintf(stderr, "peer-copy: %s\n", why.c_str()), 1;
  if (kill_owner) {
    kill(ref.pid, SIGKILL);
    for (int i = 0; i < 1000 && !exited(ref.pid); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!exited(ref.pid))
      return std::fprintf(stderr, "peer-copy: process %d outlived SIGKILL\n", ref.pid), 1;
  }
  event_loop loop;
  cuda_device_memory memory(device);
  auto engine = cuda_copy_engine::make(loop, device);
  if (!engine) return std::fprintf(stderr, "peer-copy: %s\n", engine.error().message().c_str()), 1;
  const std::uint64_t n = bytes / chunk;
  auto into = memory.allocate(n * chunk);
  auto local = memory.allocate(n * chunk);
  if (!into || !local)
    return std::fprintf(stderr, "peer-copy: cannot allocate 2 x %llu bytes\n",
                        static_cast<unsigned long long>(n * chunk)),
           1;
  std::error_code failure;
  auto run = [&](const std::byte* from, std::uint64_t count) {
    pipeline(
        loop, count, depth,
        [&](std::uint64_t i, auto done) {
          (*engine)->async_copy({{*into + i * chunk, from + i * chunk, chunk}}, std::move(done));
        },
        failure);
  };
  const std::byte* remote = (*peer)->bytes().data();
  run(remote, std::min<std::uint64_t>(n, 8));
  const double p0 = now_s();
  run(remote, n);
  const double p1 = now_s();
  bool same = true;  // the first and the last chunk, as copied from the other process
  host_buffer check(chunk);
  for (const std::uint64_t at : {std::uint64_t{0}, (n - 1) * chunk}) {
    if (auto ec = cuda_copy_blocking(check.data(), *into + at, chunk)) failure = ec;
    for (std::uint64_t i = 0; i < chunk; i += 4099)
      same = same && check.data()[i] == pattern_at(at + i);
  }
  run(*local, n);  // the same bytes inside this GPU
  const double l0 = now_s();
  run(*local, n);
  const double l1 = now_s();
  write_file(dir / "done", "1\n");
  if (failure) return std::fprintf(stderr, "peer-copy: %s\n", failure.message().c_str()), 1;
  std::printf(
      "{\"stage\":\"peer-copy\",\"device\":%d,\"bytes\":%llu,\"verified\":%s,\"owner_killed\":%s,"
      "\"peer_start\":%.6f,"
      "\"peer_end\":%.6f,\"local_start\":%.6f,\"local_end\":%.6f}\n",
      device, static_cast<unsigned long long>(n * chunk), same ? "true" : "false",
      kill_owner ? "true" : "false", p0, p1, l0, l1);
  memory.release(*into);
  memory.release(*local);
  return same ? 0 : 1;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  using namespace ferry;
  std::vector<std::string> a(argv + 1, argv + argc);
  auto u64 = [&](std::size_t i) { return std::stoull(a.at(i)); };
  try {
    if (!a.empty() && a[0] == "copy" && a.size() == 5) {
      return copy_stage(std::stoi(a[1]), u64(2), u64(3), static_cast<std::uint32_t>(u64(4)));
    }
    if (!a.empty() && a[0] == "host-offload" && a.size() == 4) {
      return host_offload_stage(u64(1), u64(2), static_cast<std::uint32_t>(u64(3)));
    }
    if (!a.empty() && a[0] == "p2p-recv" && a.size() >= 7) {
      return p2p_recv(a[1], static_cast<std::uint32_t>(u64(2)), u64(3), u64(4),
                      static_cast<std::uint32_t>(u64(5)), a[6], a.size() > 7 ? a[7] : "");
    }
    if (!a.empty() && a[0] == "p2p-send" && a.size() >= 8) {
      return p2p_send(a[1], static_cast<std::uint32_t>(u64(2)), static_cast<std::uint32_t>(u64(3)),
                      u64(4), u64(5), static_cast<std::uint32_t>(u64(6)), a[7],
                      a.size() > 8 ? a[8] : "");
    }
    if (!a.empty() && a[0] == "bcast" && (a.size() == 8 || a.size() == 9)) {
      return bcast_rank(a[1], static_cast<std::uint32_t>(u64(2)),
                        static_cast<std::uint32_t>(u64(3)), std::stoi(a[4]), u64(5), u64(6),
                        static_cast<std::uint32_t>(u64(7)),
                        a.size() == 9 ? static_cast<std::uint32_t>(u64(8)) : 1u);
    }
    if (!a.empty() && a[0] == "peer-export" && a.size() == 4)
      return peer_export(a[1], std::stoi(a[2]), u64(3));
    if (!a.empty() && a[0] == "peer-copy" &&
        (a.size() == 6 || (a.size() == 7 && a[6] == "kill-owner"))) {
      return peer_copy(a[1], std::stoi(a[2]), u64(3), u64(4), static_cast<std::uint32_t>(u64(5)),
                       a.size() == 7);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry_gpu_bench: %s\n", e.what());
    return 2;
  }
  std::fprintf(stderr, "usage: see the comment at the top of bench/gpu_bench.cpp\n");
  return 2;
}
