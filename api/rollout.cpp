// The public rollout: a rollout_worker on a loop thread of its own.
#include <fmt/format.h>

#include <condition_variable>
#include <mutex>

#include "actors/rollout_worker.hpp"
#include "api/member_link.hpp"
#include "api/member_table.hpp"
#include "collectives/host/chain_broadcast.hpp"
#include "ferry/ferry.hpp"
#include "runtime/log.hpp"

namespace ferry {

using namespace api;

struct rollout::impl : member_table {
  options opts;
  api::member_thread thread;
  std::unique_ptr<rollout_worker> worker;  ///< loop thread only

  // Guarded by `mutex`:
  std::function<void(std::uint64_t, const tensor&, std::span<const std::byte>)> on_tensor;
  std::function<void(std::uint64_t)> on_version;
  std::function<void(std::uint64_t, const status&)> on_update_failed;
  std::uint64_t version = 0;
  std::uint64_t newest_failed = 0;  ///< the newest version that failed, and why
  std::string newest_failure;

  void fail(const std::string& why) {
    std::lock_guard lock(mutex);
    if (!failure && !closed) failure = why;  // once closed, the links' loss is no failure
    changed.notify_all();
  }

  /// Loop thread: what the worker tells, passed to the caller's callbacks (taken under the lock,
  /// called outside it) and to the waits.
  void watch(rollout_worker& w) {
    w.on_tensor = [this](std::uint64_t v, const tensor_spec& spec,
                         std::span<const std::byte> bytes) {
      decltype(on_tensor) fn;
      {
        std::lock_guard lock(mutex);
        fn = on_tensor;
      }
      if (!fn) return;
      tensor t{.name = spec.name,
               .dtype = std::string(dtype_name(spec.type)),
               .shape = {spec.shape.begin(), spec.shape.end()},
               .data = const_cast<std::byte*>(bytes.data()),
               .device = thread.gpu() ? thread.gpu()->device : -1};
      if (bytes.size() != spec.nbytes) {  // a row range: the shape of the rows held here
        t.shape[0] = static_cast<std::int64_t>(bytes.size() / (spec.nbytes / spec.shape[0]));
      }
      fn(v, t, bytes);
    };
    w.on_update_failed = [this](std::uint64_t v, const std::string& reason) {
      const auto outcome =
          failed(api_errc::update_failed, fmt::format("version {}: {}", v, reason));
      decltype(on_update_failed) fn;
      {
        std::lock_guard lock(mutex);
        if (v > newest_failed) {
          newest_failed = v;
          newest_failure = outcome.message;
        }
        changed.notify_all();
        fn = on_update_failed;
      }
      if (fn) fn(v, outcome);
    };
    w.on_version = [this](std::uint64_t v) {
      decltype(on_version) fn;
      {
        std::lock_guard lock(mutex);
        version = std::max(version, v);
        changed.notify_all();
        fn = on_version;
      }
      if (fn) fn(v);
    };
    w.on_failed = [this](const std::string& reason) { fail(reason); };
    w.on_job_end = [this] { end(); };
  }
};

rollout::rollout(options o) : impl_(std::make_unique<impl>()) {
  impl_->opts = std::move(o);
}

rollout::~rollout() {
  close();
}

status rollout::register_tensor(const tensor& t) {
  return impl_->add(t, false, "rollout");
}

status rollout::register_rows(const tensor& t, std::int64_t first_row, std::int64_t rows) {
  return impl_->add(t, false, "rollout", std::pair{first_row, rows});
}

void rollout::on_tensor(
    std::function<void(std::uint64_t, const tensor&, std::span<const std::byte>)> fn) {
  std::lock_guard lock(impl_->mutex);
  impl_->on_tensor = std::move(fn);
}

void rollout::on_update_failed(std::function<void(std::uint64_t, const status&)> fn) {
  std::lock_guard lock(impl_->mutex);
  impl_->on_update_failed = std::move(fn);
}

void rollout::on_version(std::function<void(std::uint64_t)> fn) {
  std::lock_guard lock(impl_->mutex);
  impl_->on_version = std::move(fn);
}

namespace {

/// The GPU a rollout's copies and collective run on: where its tensors are, or, for a rollout
/// that registers nothing, `asked` (-1: none).
status rollout_device(const std::vector<tensor_ref>& tensors, int asked, int& device) {
  if (auto st = member_device(tensors, "rollout", device); !st) return st;
  if (asked < 0) return {};
  if (!tensors.empty()) {
    return failed(api_errc::invalid_argument,
                  fmt::format("rollout: options.device {} is for a rollout that registers "
                              "nothing; its registered tensors say where they are",
                              asked));
  }
  device = asked;
  return {};
}

}  // namespace

status rollout::join() {
  auto* self = impl_.get();
  const auto& o = self->opts;
  std::vector<tensor_ref> tensors;
  if (auto st = self->ready_to_join("rollout", true, tensors); !st) return st;
  if (!o.node_id && (o.instance >= 1024 || o.rank >= 1024)) {
    return failed(api_errc::invalid_argument,
                  "rollout: instance and rank below 1024, or give options.node_id");
  }
  int device = -1;
  if (auto st = rollout_device(tensors, o.device, device); !st) return st;
  member_link link;
  if (auto st = link_to_coordinator(o, "rollout", link); !st) return st;
  const node_id id = o.node_id ? o.node_id : (1u << 20) + (o.instance << 10) + o.rank;
  const worker_options worker_opts{
      .checksums = o.checksums, .digests = o.digests, .make_broadcast = host_chain(chain_tag)};
  auto s = self->thread.start(
      link.scheme, id, std::move(link.settings),
      [self, tensors, worker_opts, reach = link.coordinator, instance = o.instance, rank = o.rank,
       trace = o.trace_file](node& host) -> status {
        if (auto st = reach_coordinator(host, reach, "rollout"); !st) return st;
        keep_trace(host, trace);
        auto on_host = worker_opts;
        if (auto* gpu = self->thread.gpu()) {  // device slots, and the instance's NCCL collective
          on_host.memory = gpu->memory.get();
          on_host.make_broadcast = gpu->make_broadcast;
        }
        self->worker =
            std::make_unique<rollout_worker>(host, job_actor, address{coordinator_node, job_actor},
                                             instance, rank, tensors, on_host);
        self->watch(*self->worker);
        self->worker->join();
        return {};
      },
      [self, trace = o.trace_file](node& host) {
        if (!self->worker) return;
        depart(host, *self->worker, self->reason_to_leave());
        self->worker.reset();
        write_trace(host, trace);
      },
      device);
  if (!s) return s;
  std::lock_guard lock(self->mutex);
  self->joined = true;
  return {};
}

std::uint64_t rollout::version() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->version;
}

status rollout::wait_version(std::uint64_t version, std::chrono::milliseconds timeout) const {
  auto* s = impl_.get();
  {
    std::lock_guard lock(s->mutex);
    if (!s->joined) return failed(api_errc::not_joined, "rollout: wait_version before join");
  }
  return wait_for(
      s->mutex, s->changed, timeout,
      [&] {
        return s->version >= version || s->newest_failed >= version || s->failure || s->closed ||
               s->ended;
      },
      [&]() -> status {
        if (s->version >= version) return {};
        if (s->newest_failed >= version) return failed(api_errc::update_failed, s->newest_failure);
        if (s->failure) return failed(api_errc::job_failed, *s->failure);
        if (s->ended)
          return failed(api_errc::closed,
                        fmt::format("rollout: the job ended before version {}", version));
        return failed(api_errc::closed, "rollout closed");
      },
      fmt::format("rollout: waiting for version {}", version));
}

status rollout::wait_end(std::chrono::milliseconds timeout) const {
  return impl_->wait_end(timeout, "rollout");
}

void rollout::close(const std::string& reason) {
  impl_->mark_closed(reason);
  impl_->thread.stop();
}

}  // namespace ferry
