// The public trainer: a trainer_shard on a loop thread of its own.
#include <fmt/format.h>

#include <condition_variable>
#include <mutex>

#include "actors/trainer_shard.hpp"
#include "api/member_link.hpp"
#include "api/member_table.hpp"
#include "ferry/ferry.hpp"
#include "runtime/log.hpp"

namespace ferry {

using namespace api;

struct trainer::update::state {
  std::uint64_t version = 0;
  std::mutex mutex;
  std::condition_variable changed;
  std::optional<status> offloaded, delivered;
  std::vector<std::function<void(const status&)>> offloaded_fns, delivered_fns;

  /// Loop thread: the offload (or delivery) ended with `s`; waiters and callbacks learn it.
  void settle(std::optional<status> state::*which,
              std::vector<std::function<void(const status&)>> state::*fns, status s) {
    std::vector<std::function<void(const status&)>> call;
    {
      std::lock_guard lock(mutex);
      if (this->*which) return;
      this->*which = s;
      call.swap(this->*fns);
      changed.notify_all();
    }
    for (auto& fn : call) fn(s);
  }
  status wait(std::optional<status> state::*which, std::chrono::milliseconds timeout,
              const char* what) {
    std::unique_lock lock(mutex);
    if (!changed.wait_for(lock, timeout, [&] { return (this->*which).has_value(); })) {
      return failed(api_errc::timed_out,
                    fmt::format("version {}: not {} within {} ms", version, what, timeout.count()));
    }
    return *(this->*which);
  }
  void on(std::optional<status> state::*which,
          std::vector<std::function<void(const status&)>> state::*fns,
          std::function<void(const status&)> fn) {
    std::unique_lock lock(mutex);
    if (!(this->*which)) return (this->*fns).push_back(std::move(fn));
    const auto s = *(this->*which);
    lock.unlock();
    fn(s);
  }
};

std::uint64_t trainer::update::version() const {
  return state_->version;
}
status trainer::update::wait_offloaded(std::chrono::milliseconds timeout) const {
  return state_->wait(&state::offloaded, timeout, "offloaded");
}
status trainer::update::wait_delivered(std::chrono::milliseconds timeout) const {
  return state_->wait(&state::delivered, timeout, "delivered");
}
void trainer::update::on_offloaded(std::function<void(const status&)> fn) const {
  state_->on(&state::offloaded, &state::offloaded_fns, std::move(fn));
}
void trainer::update::on_delivered(std::function<void(const status&)> fn) const {
  state_->on(&state::delivered, &state::delivered_fns, std::move(fn));
}

struct trainer::impl : member_table {
  options opts;
  api::member_thread thread;
  std::unique_ptr<trainer_shard> shard;  ///< loop thread only
  std::optional<std::uint64_t> waiting;  ///< loop thread: published before the job was ready

  // Guarded by `mutex`:
  bool ready = false;  ///< the job was ready for this shard at least once
  std::uint64_t next_version = 1;
  std::uint64_t last_published = 0;
  std::uint64_t offloading = 0;  ///< the version whose offload is running; 0: none
  std::map<std::uint64_t, std::shared_ptr<update::state>> updates;
  std::uint64_t writing = 0;  ///< the version published written until it is offloaded; 0: none
  std::shared_ptr<copy_writes> writes;  ///< where its bytes go, once its copy may be written
  std::unordered_map<std::string, std::size_t> index_of;  ///< tensor name -> place in `tensors`

  std::shared_ptr<update::state> find(std::uint64_t v) {
    std::lock_guard lock(mutex);
    auto it = updates.find(v);
    return it == updates.end() ? nullptr : it->second;
  }
  void offloaded(std::uint64_t v, status s) {
    {
      std::lock_guard lock(mutex);
      if (offloading == v) offloading = 0;
      if (writing == v) writing = 0, writes.reset();
      changed.notify_all();
    }
    if (auto u = find(v))
      u->settle(&update::state::offloaded, &update::state::offloaded_fns, std::move(s));
  }
  void delivered(std::uint64_t v, status s) {
    if (auto u = find(v)) u->settle(&update::state::delivered, &update::state::delivered_fns, s);
    std::lock_guard lock(mutex);
    updates.erase(v);
  }
  /// Loop thread: every update still open ends with `s`.
  void settle_all(const status& s) {
    std::vector<std::uint64_t> open;
    {
      std::lock_guard lock(mutex);
      for (const auto& [v, u] : updates) open.push_back(v);
    }
    for (auto v : open) {
      offloaded(v, s);
      delivered(v, s);
    }
  }
  /// `publish` or `publish_written` (`written`).
  status publish(std::uint64_t version, bool written, trainer::update* out);
  void start_publish(std::uint64_t v) {
    std::string why;
    const bool written = [&] {
      std::lock_guard lock(mutex);
      return writing == v;
    }();
    if (!(written ? shard->publish_written(v, why) : shard->publish(v, why))) {
      offloaded(v, failed(api_errc::invalid_argument, why));
      delivered(v, failed(api_errc::invalid_argument, why));
    }
  }

  /// Loop thread: what the shard tells, to the publish in progress, the waits and the caller.
  void watch(trainer_shard& t) {
    t.on_ready = [this] {
      {
        std::lock_guard lock(mutex);
        ready = true;
        next_version = shard->next_version();
        changed.notify_all();
      }
      if (auto v = std::exchange(waiting, std::nullopt)) start_publish(*v);
    };
    t.on_offloaded = [this](std::uint64_t v, double) { offloaded(v, {}); };
    t.on_write_target = [this](std::uint64_t v, std::shared_ptr<copy_writes> target) {
      std::lock_guard lock(mutex);
      if (writing == v) writes = std::move(target);
      changed.notify_all();
    };
    t.on_delivered = [this](std::uint64_t v, bool) { delivered(v, {}); };
    t.on_update_failed = [this](std::uint64_t v, const std::string& reason) {
      const auto outcome =
          failed(api_errc::update_failed, fmt::format("version {}: {}", v, reason));
      offloaded(v, outcome);
      delivered(v, outcome);
    };
    t.on_failed = [this](const std::string& reason) {
      {
        std::lock_guard lock(mutex);
        failure = reason;
        changed.notify_all();
      }
      settle_all(failed(api_errc::job_failed, reason));
    };
    t.on_job_end = [this] {
      end();
      settle_all(failed(api_errc::closed, "the job ended"));
    };
  }
};

trainer::trainer(options o) : impl_(std::make_unique<impl>()) {
  impl_->opts = std::move(o);
}

trainer::~trainer() {
  close();
}

status trainer::register_tensor(const tensor& t) {
  return impl_->add(t, true, "trainer");
}

status trainer::join() {
  auto* self = impl_.get();
  const auto& o = self->opts;
  std::vector<tensor_ref> tensors;
  if (auto st = self->ready_to_join("trainer", false, tensors); !st) return st;
  int device = -1;
  if (auto st = member_device(tensors, "trainer", device); !st) return st;
  member_link link;
  if (auto st = link_to_coordinator(o, "trainer", link); !st) return st;
  const node_id id = o.node_id ? o.node_id : 1 + o.shard;
  const trainer_options shard_options{.checksums = o.checksums, .digests = o.digests};
  auto s = self->thread.start(
      link.scheme, id, std::move(link.settings),
      [self, tensors, shard_options, reach = link.coordinator, shard = o.shard,
       trace = o.trace_file](node& host) -> status {
        if (auto st = reach_coordinator(host, reach, "trainer"); !st) return st;
        keep_trace(host, trace);
        auto on_host = shard_options;
        if (auto* gpu = self->thread.gpu()) on_host.memory = gpu->memory.get();
        self->shard = std::make_unique<trainer_shard>(
            host, job_actor, address{coordinator_node, job_actor}, shard, tensors, on_host);
        self->watch(*self->shard);
        self->shard->join();
        return {};
      },
      [self, trace = o.trace_file](node& host) {
        if (!self->shard) return;
        self->settle_all(failed(api_errc::closed, "trainer closed"));
        depart(host, *self->shard, self->reason_to_leave());
        self->shard.reset();
        write_trace(host, trace);
      },
      device);
  if (!s) return s;
  std::lock_guard lock(self->mutex);
  self->joined = true;
  for (std::size_t i = 0; i < self->tensors.size(); ++i)
    self->index_of[self->tensors[i].spec.name] = i;
  return {};
}

status trainer::publish(std::uint64_t version, update* out) {
  return impl_->publish(version, false, out);
}

status trainer::publish_written(std::uint64_t version, update* out) {
  return impl_->publish(version, true, out);
}

status trainer::impl::publish(std::uint64_t version, bool written, trainer::update* out) {
  auto u = std::make_shared<update::state>();
  u->version = version;
  {
    std::lock_guard lock(mutex);
    if (closed) return failed(api_errc::closed, "trainer: closed");
    if (!joined) return failed(api_errc::not_joined, "trainer: publish before join");
    if (failure) return failed(api_errc::job_failed, *failure);
    if (ended) return failed(api_errc::closed, "trainer: the job ended");
    if (offloading) {
      return failed(
          api_errc::busy,
          fmt::format("trainer: version {} is still offloading; wait for it before publishing {}",
                      offloading, version));
    }
    if (version <= last_published) {
      return failed(
          api_errc::invalid_argument,
          fmt::format("trainer: version {} is not newer than {}", version, last_published));
    }
    if (written &&
        std::any_of(tensors.begin(), tensors.end(), [](const auto& t) { return t.device >= 0; })) {
      return failed(
          api_errc::invalid_argument,
          "trainer: publish_written takes tensors in host memory; publish those on a GPU");
    }
    last_published = version;
    offloading = version;
    writing = written ? version : 0;
    updates[version] = u;
  }
  thread.post([this, version] {
    if (!shard) return;
    if (shard->ready()) return start_publish(version);
    waiting = version;  // the job is not ready yet (or regroups): on_ready publishes it
  });
  if (out) *out = update(u);
  return {};
}

status trainer::write(const std::string& name, std::span<const std::byte> bytes,
                      std::chrono::milliseconds timeout) {
  auto* self = impl_.get();
  std::shared_ptr<copy_writes> target;
  std::size_t index = 0;
  std::uint64_t version = 0;
  {
    std::unique_lock lock(self->mutex);
    const auto it = self->index_of.find(name);
    if (!self->writing)
      return failed(api_errc::invalid_argument, "trainer: write without publish_written");
    if (it == self->index_of.end())
      return failed(api_errc::invalid_argument,
                    fmt::format("trainer: write: no tensor '{}' registered", name));
    if (const auto want = self->tensors[it->second].spec.nbytes; bytes.size() != want) {
      return failed(api_errc::invalid_argument,
                    fmt::format("trainer: write: tensor '{}' is {} bytes, given {}", name, want,
                                bytes.size()));
    }
    if (!self->changed.wait_for(lock, timeout,
                                [&] { return self->writes || !self->writing || self->closed; })) {
      return failed(api_errc::timed_out,
                    fmt::format("trainer: version {}: its copy not free to write within {} ms",
                                self->writing, timeout.count()));
    }
    if (self->closed) return failed(api_errc::closed, "trainer: closed");
    if (!self->writes)
      return failed(api_errc::update_failed,
                    "trainer: write: the version stopped before its copy was free");
    target = self->writes;
    index = it->second;
    version = self->writing;
  }
  auto whole = target->write(index, bytes.data());
  if (!whole)
    return failed(api_errc::invalid_argument,
                  fmt::format("trainer: tensor '{}' written twice in version {}", name, version));
  if (!whole->empty()) {
    self->thread.post([self, version, whole = std::move(*whole)] {
      if (self->shard) self->shard->chunks_written(version, whole);
    });
  }
  return {};
}

status trainer::wait_ready(std::chrono::milliseconds timeout) const {
  auto* s = impl_.get();
  return wait_for(
      s->mutex, s->changed, timeout,
      [&] { return s->ready || s->failure || s->closed || s->ended; },
      [&]() -> status {
        if (s->ready) return {};
        if (s->failure) return failed(api_errc::job_failed, *s->failure);
        return failed(api_errc::closed, s->ended ? "trainer: the job ended" : "trainer: closed");
      },
      "trainer: waiting for the job to be ready");
}

std::uint64_t trainer::next_version() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->next_version;
}

status trainer::wait_end(std::chrono::milliseconds timeout) const {
  return impl_->wait_end(timeout, "trainer");
}

void trainer::close(const std::string& reason) {
  impl_->mark_closed(reason);
  impl_->thread.stop();
}

}  // namespace ferry
