#include "ferry/ferry.hpp"

#include <fmt/format.h>

#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include "actors/coordinator.hpp"
#include "actors/rollout_worker.hpp"
#include "actors/tensor.hpp"
#include "actors/trainer_shard.hpp"
#include "api/member_thread.hpp"
#include "collectives/host/chain_broadcast.hpp"
#include "runtime/clock.hpp"
#include "runtime/log.hpp"
#include "transport/fabric/fabric_transport.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace ferry {

// The public API's defaults are the job's.
static_assert(coordinator::options{}.chunk_bytes == default_chunk_bytes);
static_assert(coordinator::options{}.depth == default_depth);

using api::failed;

namespace {

constexpr node_id coordinator_node = 0;
constexpr actor_id job_actor = 1;

/// Lets what the actors just sent (a leave, a job stop) reach the wire before the node goes.
void drain(node& host, std::chrono::milliseconds period) {
  bool done = false;
  const auto timer = host.clock().async_wait(period, [&](std::error_code) { done = true; });
  host.env().loop().run_until([&] { return done; });
  host.clock().cancel(timer);
}

/// Loop thread: a closing member leaves the job saying `reason`, and its last frame gets time to
/// go out. A failed member leaves nothing: the error it sent the coordinator gets that time (a
/// worker that closed at once had its error die with its links, and the coordinator waited out
/// its timeout). After the job's end it only lingers, so that the other members hear the end
/// before its links close.
void depart(node& host, job_member& member, const std::string& reason) {
  if (member.stopped()) {
    drain(host, std::chrono::milliseconds(100));
    return;
  }
  if (!member.failed()) member.leave(reason);
  drain(host, std::chrono::milliseconds(200));
}

/// Loop thread: a member with a trace file keeps its timeline, and writes it as it closes.
void keep_trace(node& host, const std::string& file) {
  if (!file.empty()) host.env().trace().keep_records();
}
void write_trace(node& host, const std::string& file) {
  if (file.empty()) return;
  if (auto ec = host.env().trace().write_chrome(file)) log::error("cannot write the trace to {}: {}", file, ec.message());
}

/// Waits on `cv` until `ready()` or `timeout`; the status `outcome()` gives, or timed_out.
template <class Ready, class Outcome>
status wait_for(std::mutex& m, std::condition_variable& cv, std::chrono::milliseconds timeout,
                Ready ready, Outcome outcome, const std::string& what) {
  std::unique_lock lock(m);
  if (!cv.wait_for(lock, timeout, ready))
    return failed(api_errc::timed_out,
                  fmt::format("{}: timed out after {} ms", what, timeout.count()));
  return outcome();
}

/// `t` as the actors' tensor_ref, or why not.
std::optional<tensor_ref> to_ref(const tensor& t, bool data_required, std::string& why) {
  if (t.name.empty()) return why = "a tensor without a name", std::nullopt;
  auto type = parse_dtype(t.dtype);
  if (!type)
    return why = fmt::format("tensor '{}': unknown dtype '{}'", t.name, t.dtype), std::nullopt;
  for (auto d : t.shape) {
    if (d < 0)
      return why = fmt::format("tensor '{}': negative dimension {}", t.name, d), std::nullopt;
  }
  if ((data_required || t.device >= 0) && !t.data)
    return why = fmt::format("tensor '{}': null data pointer", t.name), std::nullopt;
  auto spec = make_tensor_spec(t.name, *type, t.shape);
  if (spec.nbytes == 0) return why = fmt::format("tensor '{}': zero bytes", t.name), std::nullopt;
  return tensor_ref{.spec = std::move(spec), .data = static_cast<std::byte*>(t.data), .device = t.device};
}

/// "device 3", "host memory".
std::string where(int device) {
  return device >= 0 ? fmt::format("device {}", device) : "host memory";
}

/// The one device a member's tensors live on (-1: host memory), or why there is not one.
status member_device(const std::vector<tensor_ref>& tensors, const char* who, int& device) {
  device = tensors.empty() ? -1 : tensors.front().device;
  for (const auto& t : tensors) {
    if (t.device != device) {
      return failed(api_errc::invalid_argument,
                    fmt::format("{}: tensor '{}' is in {} and tensor '{}' in {}: one device per member", who,
                                tensors.front().spec.name, where(device), t.spec.name, where(t.device)));
    }
  }
  return {};
}

/// How a member reaches its coordinator: the transport's scheme, its settings (the job secret,
/// the fabric provider) and the coordinator's transport address.
struct member_link {
  std::string scheme;
  api::link_settings settings;
  std::string coordinator;
};

status link_to_coordinator(const member_options& o, const char* who, member_link& out) {
  std::string why;
  auto a = api::parse_address(o.coordinator, why);
  if (!a) return failed(api_errc::invalid_argument, fmt::format("{}: {}", who, why));
  out.scheme = a->scheme;
  out.coordinator = a->rest;
  if (a->scheme == "fabric") {  // fabric://PROVIDER/ENDPOINT
    const auto slash = a->rest.find('/');
    if (slash == std::string::npos) {
      return failed(
          api_errc::invalid_argument,
          fmt::format("{}: address '{}': expected fabric://provider/endpoint", who, o.coordinator));
    }
    out.settings.fabric_provider = a->rest.substr(0, slash);
    out.coordinator = a->rest.substr(slash + 1);
  }
  if (a->scheme == "inproc") {  // inproc://NAME: the coordinator is node 0 of that network
    out.settings.inproc_job = a->rest;
    out.coordinator = std::to_string(coordinator_node);
  }
  // Other members connect to this one: it listens where the coordinator's side can reach it.
  if (!o.listen_host.empty()) {
    out.settings.bind_host = o.listen_host;
  } else if (a->scheme == "tcp" || a->scheme == "cma") {
    if (auto local = local_host_toward(out.coordinator); !local.empty()) out.settings.bind_host = local;
  }
  return api::load_secret(a->scheme, o.secret, o.allow_unauthenticated, out.settings);
}

/// Loop thread: tells `host`'s transport where the coordinator is.
status reach_coordinator(node& host, const std::string& address, const char* who) {
  if (auto ec = host.transport().add_peer(coordinator_node, address)) {
    return failed(api_errc::invalid_argument,
                  fmt::format("{}: coordinator '{}': {}", who, address, ec.message()));
  }
  return {};
}

/// What a trainer and a rollout share until they join: the tensor table, under `mutex`.
struct member_table {
  mutable std::mutex mutex;  ///< guards this table and the derived state's shared fields
  mutable std::condition_variable changed;
  std::vector<tensor_ref> tensors;
  std::set<std::string> names;
  bool joined = false, closed = false;
  bool ended = false;  ///< the coordinator ended the job
  std::optional<std::string> failure;
  std::string leave_reason = "closed";

  std::string reason_to_leave() const {
    std::lock_guard lock(mutex);
    return leave_reason;
  }

  /// Loop thread: the coordinator ended the job.
  void end() {
    std::lock_guard lock(mutex);
    ended = true;
    changed.notify_all();
  }
  status wait_end(std::chrono::milliseconds timeout, const char* who) const {
    return wait_for(
        mutex, changed, timeout, [&] { return ended || failure || closed; },
        [&]() -> status {
          if (failure) return failed(api_errc::job_failed, *failure);
          if (ended) return {};
          return failed(api_errc::closed, fmt::format("{}: closed", who));
        },
        fmt::format("{}: waiting for the job's end", who));
  }

  /// Registers `t`, or with `rows` ([first, first + count) of its first dimension) that part of it.
  status add(const tensor& t, bool data_required, const char* who,
             std::optional<std::pair<std::int64_t, std::int64_t>> rows = std::nullopt) {
    std::lock_guard lock(mutex);
    if (joined)
      return failed(api_errc::already_joined,
                    fmt::format("tensor '{}': registered after join", t.name));
    std::string why;
    auto ref = to_ref(t, data_required, why);
    if (!ref) return failed(api_errc::invalid_argument, fmt::format("{}: {}", who, why));
    if (rows) {
      const auto [first, count] = *rows;
      const std::int64_t all = t.shape.empty() ? 0 : t.shape[0];
      if (first < 0 || count < 1 || first > all || count > all - first) {
        return failed(api_errc::invalid_argument,
                      fmt::format("{}: tensor '{}': rows [{}, {}) lie outside its {} rows", who,
                                  t.name, first, first + count, all));
      }
      const std::uint64_t row_bytes = ref->spec.nbytes / static_cast<std::uint64_t>(all);
      ref->part = byte_range{static_cast<std::uint64_t>(first) * row_bytes,
                             static_cast<std::uint64_t>(count) * row_bytes};
    }
    if (!names.insert(t.name).second) {
      return failed(api_errc::invalid_argument,
                    fmt::format("{}: tensor '{}' registered twice (one row range per tensor)", who,
                                t.name));
    }
    tensors.push_back(*ref);
    return {};
  }
  /// The table to join with, or why this member cannot join.
  status ready_to_join(const char* who, bool may_be_empty, std::vector<tensor_ref>& out) const {
    std::lock_guard lock(mutex);
    if (closed) return failed(api_errc::closed, fmt::format("{}: closed", who));
    if (joined) return failed(api_errc::already_joined, fmt::format("{}: join called twice", who));
    if (tensors.empty() && !may_be_empty)
      return failed(api_errc::invalid_argument, fmt::format("{}: no tensor registered", who));
    out = tensors;
    return {};
  }
};

}  // namespace

const char* version_string() noexcept {
  return "0.2.0";
}

status clean_up_killed_process(std::int32_t pid, std::size_t* removed) {
  if (removed) *removed = 0;
  if (pid <= 0) return failed(api_errc::invalid_argument, fmt::format("clean_up_killed_process: pid {}", pid));
  // Dead and not reaped is a zombie; reaped, it has no /proc entry. Anything else still runs.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (std::getline(stat, line)) {
    const auto name_end = line.rfind(')');
    const char state = name_end != std::string::npos && name_end + 2 < line.size() ? line[name_end + 2] : '?';
    if (state != 'Z' && state != 'X')
      return failed(api_errc::invalid_argument,
                    fmt::format("clean_up_killed_process: process {} still runs; its files are in use", pid));
  }
  const auto count = remove_shm_regions_of(pid);
  if (removed) *removed = count;
  return {};
}

status set_log_level(const std::string& level) {
  const auto parsed = log::parse_level(level);
  if (!parsed) {
    return failed(api_errc::invalid_argument,
                  fmt::format("log level '{}': one of debug, info, warn, error, off", level));
  }
  log::set_level(*parsed);
  return {};
}

const std::error_category& api_category() noexcept {
  struct category final : std::error_category {
    const char* name() const noexcept override { return "ferry"; }
    std::string message(int e) const override {
      switch (static_cast<api_errc>(e)) {
        case api_errc::invalid_argument:
          return "invalid argument";
        case api_errc::closed:
          return "closed";
        case api_errc::not_joined:
          return "not joined";
        case api_errc::already_joined:
          return "already joined";
        case api_errc::busy:
          return "the previous version is still offloading";
        case api_errc::timed_out:
          return "timed out";
        case api_errc::unreachable:
          return "unreachable";
        case api_errc::job_failed:
          return "the job failed";
        case api_errc::update_failed:
          return "the update failed";
      }
      return "unknown ferry error";
    }
  };
  static const category c;
  return c;
}

// ---- coordinator ----

struct coordinator::impl {
  api::member_thread thread;
  std::unique_ptr<job_coordinator> actor;  ///< loop thread only
  std::string address;
  mutable std::mutex mutex;
  mutable std::condition_variable changed;
  std::uint64_t delivered = 0;
  std::optional<std::string> failure;
  bool closed = false;
};

coordinator::coordinator(options o, status& ok) : impl_(std::make_unique<impl>()) {
  ok = open(std::move(o));
}

status coordinator::open(options o) {
  std::string why;
  auto listen = api::parse_address(o.listen, why);
  if (!listen) return failed(api_errc::invalid_argument, why);
  const auto p2p = parse_p2p_mode(o.p2p);
  if (!p2p) return failed(api_errc::invalid_argument, "coordinator: p2p '" + o.p2p + "': auto, device or host");
  if (o.trainers == 0 || o.instance_sizes.empty() ||
      std::find(o.instance_sizes.begin(), o.instance_sizes.end(), 0u) != o.instance_sizes.end()) {
    return failed(api_errc::invalid_argument,
                  "coordinator: at least one trainer, and instances of at least one worker");
  }
  if (auto no = chunk_bytes_refusal(o.chunk_bytes))
    return failed(api_errc::invalid_argument, fmt::format("coordinator: chunk_bytes {}: {}", o.chunk_bytes, *no));
  if (auto no = depth_refusal(o.depth)) return failed(api_errc::invalid_argument, "coordinator: " + *no);
  api::link_settings settings;
  if (auto s = api::load_secret(listen->scheme, o.secret, o.allow_unauthenticated, settings); !s)
    return s;
  if (listen->scheme == "fabric") {
    settings.fabric_provider = listen->rest;
  } else if (listen->scheme == "inproc") {
    settings.inproc_job = listen->rest;
  } else {
    const auto colon = listen->rest.rfind(':');
    if (colon == std::string::npos)
      return failed(api_errc::invalid_argument, "listen address '" + o.listen + "': no port");
    settings.bind_host = listen->rest.substr(0, colon);
    try {
      settings.port = static_cast<std::uint16_t>(std::stoul(listen->rest.substr(colon + 1)));
    } catch (const std::exception&) {
      return failed(api_errc::invalid_argument, "listen address '" + o.listen + "': bad port");
    }
  }
  const job_shape shape{.trainers = o.trainers,
                        .instance_sizes = o.instance_sizes,
                        .chunk_bytes = o.chunk_bytes,
                        .depth = o.depth,
                        .stripes = o.stripes,
                        .p2p = *p2p};
  auto* self = impl_.get();
  const auto scheme = listen->scheme;
  const auto provider = settings.fabric_provider;
  const auto inproc_job = settings.inproc_job;
  return self->thread.start(
      scheme, coordinator_node, std::move(settings),
      [self, shape, scheme, provider, inproc_job](node& host) -> status {
        self->actor = std::make_unique<job_coordinator>(host, job_actor, shape);
        self->actor->on_delivered = [self](const version_report& r) {
          std::lock_guard lock(self->mutex);
          self->delivered = std::max(self->delivered, r.version);
          self->changed.notify_all();
        };
        self->actor->on_failed = [self](const std::string& reason) {
          std::lock_guard lock(self->mutex);
          self->failure = reason;
          self->changed.notify_all();
        };
        self->actor->start();
        self->address = scheme == "inproc"
                            ? "inproc://" + inproc_job
                            : scheme + "://" + (scheme == "fabric" ? provider + "/" : "") +
                                  host.transport().local_address();
        return {};
      },
      [self](node& host) {
        if (!self->actor) return;
        self->actor->stop_job();
        drain(host, std::chrono::milliseconds(200));
        self->actor.reset();
      });
}

coordinator::~coordinator() {
  close();
}

std::string coordinator::address() const {
  return impl_->address;
}

std::uint64_t coordinator::delivered() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->delivered;
}

std::uint64_t coordinator::next_version() const {
  std::uint64_t next = 1;
  impl_->thread.call([&] {
    if (impl_->actor) next = impl_->actor->next_version();
    return status{};
  });
  return next;
}

status coordinator::wait_delivered(std::uint64_t version, std::chrono::milliseconds timeout) const {
  auto* s = impl_.get();
  return wait_for(
      s->mutex, s->changed, timeout,
      [&] { return s->delivered >= version || s->failure || s->closed; },
      [&]() -> status {
        if (s->delivered >= version) return {};
        if (s->failure) return failed(api_errc::job_failed, *s->failure);
        return failed(api_errc::closed, "coordinator closed");
      },
      fmt::format("coordinator: waiting for version {}", version));
}

void coordinator::close() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->closed = true;
    impl_->changed.notify_all();
  }
  impl_->thread.stop();
}

// ---- trainer ----

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
        auto& t = *self->shard;
        t.on_ready = [self] {
          {
            std::lock_guard lock(self->mutex);
            self->ready = true;
            self->next_version = self->shard->next_version();
            self->changed.notify_all();
          }
          if (auto v = std::exchange(self->waiting, std::nullopt)) self->start_publish(*v);
        };
        t.on_offloaded = [self](std::uint64_t v, double) { self->offloaded(v, {}); };
        t.on_write_target = [self](std::uint64_t v, std::shared_ptr<copy_writes> target) {
          std::lock_guard lock(self->mutex);
          if (self->writing == v) self->writes = std::move(target);
          self->changed.notify_all();
        };
        t.on_delivered = [self](std::uint64_t v, bool) { self->delivered(v, {}); };
        t.on_update_failed = [self](std::uint64_t v, const std::string& reason) {
          const auto outcome =
              failed(api_errc::update_failed, fmt::format("version {}: {}", v, reason));
          self->offloaded(v, outcome);
          self->delivered(v, outcome);
        };
        t.on_failed = [self](const std::string& reason) {
          {
            std::lock_guard lock(self->mutex);
            self->failure = reason;
            self->changed.notify_all();
          }
          self->settle_all(failed(api_errc::job_failed, reason));
        };
        t.on_job_end = [self] {
          self->end();
          self->settle_all(failed(api_errc::closed, "the job ended"));
        };
        t.join();
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
      s->mutex, s->changed, timeout, [&] { return s->ready || s->failure || s->closed || s->ended; },
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
  {
    std::lock_guard lock(impl_->mutex);
    if (!impl_->closed) impl_->leave_reason = reason;
    impl_->closed = true;
    impl_->changed.notify_all();
  }
  impl_->thread.stop();
}

// ---- rollout ----

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
  if (auto st = member_device(tensors, "rollout", device); !st) return st;
  if (o.device >= 0) {
    if (!tensors.empty()) {
      return failed(api_errc::invalid_argument,
                    fmt::format("rollout: options.device {} is for a rollout that registers nothing; its "
                                "registered tensors say where they are",
                                o.device));
    }
    device = o.device;
  }
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
        auto& w = *self->worker;
        w.on_tensor = [self](std::uint64_t v, const tensor_spec& spec,
                             std::span<const std::byte> bytes) {
          decltype(self->on_tensor) fn;
          {
            std::lock_guard lock(self->mutex);
            fn = self->on_tensor;
          }
          if (!fn) return;
          tensor t{.name = spec.name,
                   .dtype = std::string(dtype_name(spec.type)),
                   .shape = {spec.shape.begin(), spec.shape.end()},
                   .data = const_cast<std::byte*>(bytes.data()),
                   .device = self->thread.gpu() ? self->thread.gpu()->device : -1};
          if (bytes.size() != spec.nbytes) {  // a row range: the shape of the rows held here
            t.shape[0] = static_cast<std::int64_t>(bytes.size() / (spec.nbytes / spec.shape[0]));
          }
          fn(v, t, bytes);
        };
        w.on_update_failed = [self](std::uint64_t v, const std::string& reason) {
          const auto outcome =
              failed(api_errc::update_failed, fmt::format("version {}: {}", v, reason));
          decltype(self->on_update_failed) fn;
          {
            std::lock_guard lock(self->mutex);
            if (v > self->newest_failed) {
              self->newest_failed = v;
              self->newest_failure = outcome.message;
            }
            self->changed.notify_all();
            fn = self->on_update_failed;
          }
          if (fn) fn(v, outcome);
        };
        w.on_version = [self](std::uint64_t v) {
          decltype(self->on_version) fn;
          {
            std::lock_guard lock(self->mutex);
            self->version = std::max(self->version, v);
            self->changed.notify_all();
            fn = self->on_version;
          }
          if (fn) fn(v);
        };
        w.on_failed = [self](const std::string& reason) { self->fail(reason); };
        w.on_job_end = [self] { self->end(); };
        w.join();
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
        return s->version >= version || s->newest_failed >= version || s->failure || s->closed || s->ended;
      },
      [&]() -> status {
        if (s->version >= version) return {};
        if (s->newest_failed >= version) return failed(api_errc::update_failed, s->newest_failure);
        if (s->failure) return failed(api_errc::job_failed, *s->failure);
        if (s->ended) return failed(api_errc::closed, fmt::format("rollout: the job ended before version {}", version));
        return failed(api_errc::closed, "rollout closed");
      },
      fmt::format("rollout: waiting for version {}", version));
}

status rollout::wait_end(std::chrono::milliseconds timeout) const {
  return impl_->wait_end(timeout, "rollout");
}

void rollout::close(const std::string& reason) {
  {
    std::lock_guard lock(impl_->mutex);
    if (!impl_->closed) impl_->leave_reason = reason;
    impl_->closed = true;
    impl_->changed.notify_all();
  }
  impl_->thread.stop();
}

}  // namespace ferry
