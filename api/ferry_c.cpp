// The C ABI: each call catches everything, keeps its message for ferry_last_error, and returns a
// status.
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "ferry/ferry.h"
#include "ferry/ferry.hpp"

struct ferry_coordinator {
  std::optional<ferry::coordinator> object;
};

struct ferry_trainer {
  explicit ferry_trainer(ferry::trainer::options o) : object(std::move(o)) {}
  ~ferry_trainer() {
    object.close();  // no callback writes to `events` from here on
    ::close(events);
  }
  ferry::trainer object;
  int events = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  std::mutex mutex;
  std::map<std::uint64_t, ferry::trainer::update> updates;
};

struct ferry_rollout {
  explicit ferry_rollout(ferry::rollout::options o) : object(std::move(o)) {}
  ~ferry_rollout() {
    object.close();
    ::close(events);
  }
  ferry::rollout object;
  int events = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
};

namespace {

static_assert(FERRY_UPDATE_FAILED == static_cast<int>(ferry::api_errc::update_failed) &&
              FERRY_INVALID_ARGUMENT == static_cast<int>(ferry::api_errc::invalid_argument));

thread_local std::string last_error;

ferry_status to_status(const ferry::status& s) {
  last_error = s.message;
  if (!s.code) return FERRY_OK;
  if (s.code.category() != ferry::api_category()) return FERRY_INTERNAL;
  return static_cast<ferry_status>(s.code.value());  // the enums share their values
}

ferry_status refuse(const char* why) {
  last_error = why;
  return FERRY_INVALID_ARGUMENT;
}

/// Runs `fn`, turning any exception into FERRY_INTERNAL with its message.
template <class F>
ferry_status guarded(F fn) {
  try {
    last_error.clear();
    return fn();
  } catch (const std::exception& e) {
    last_error = std::string("internal error: ") + e.what();
  } catch (...) {
    last_error = "internal error";
  }
  return FERRY_INTERNAL;
}

std::chrono::milliseconds ms(int64_t timeout_ms) {
  return std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
}

void signal_fd(int fd) {
  const std::uint64_t one = 1;
  (void)!::write(fd, &one, sizeof one);
}

ferry::tensor make_tensor(const char* name, const char* dtype, const int64_t* shape, size_t ndim,
                          void* data, int device = -1) {
  ferry::tensor t{.name = name, .dtype = dtype, .data = data, .device = device};
  t.shape.assign(shape, shape + ndim);
  return t;
}

ferry::member_options member(const ferry_member_options& o) {
  ferry::member_options m{.coordinator = o.coordinator ? o.coordinator : "",
                          .secret = o.secret ? o.secret : "",
                          .node_id = o.node_id};
  // A field added in a later minor version is read only from a struct that has it.
  const auto has = [&](std::size_t end) { return o.struct_size >= end; };
  if (has(offsetof(ferry_member_options, listen_host) + sizeof(o.listen_host)) && o.listen_host)
    m.listen_host = o.listen_host;
  if (has(offsetof(ferry_member_options, trace_file) + sizeof(o.trace_file)) && o.trace_file)
    m.trace_file = o.trace_file;
  return m;
}

bool sized(const ferry_member_options* o) {
  return o && o->struct_size >= offsetof(ferry_member_options, rank) + sizeof(o->rank);
}

}  // namespace

namespace {
template <class Wait>
ferry_status wait_update(ferry_trainer* t, uint64_t version, const char* what, Wait wait) {
  return guarded([&] {
    if (!t) return refuse(what);
    std::optional<ferry::trainer::update> u;
    {
      std::lock_guard lock(t->mutex);
      if (auto it = t->updates.find(version); it != t->updates.end()) u = it->second;
    }
    if (!u) return refuse("no such published version");
    return to_status(wait(*u));
  });
}

/// Registers a tensor of `handle` (a trainer or a rollout), for the C function named `what`.
template <class Handle>
ferry_status register_tensor_of(Handle* handle, const char* what, const char* name,
                                const char* dtype, const int64_t* shape, size_t ndim, void* data,
                                int device) {
  return guarded([&] {
    if (!handle || !name || !dtype || (ndim > 0 && !shape))
      return refuse((std::string(what) + ": a NULL argument").c_str());
    return to_status(
        handle->object.register_tensor(make_tensor(name, dtype, shape, ndim, data, device)));
  });
}

/// Publishes through `publish` (the trainer's publish or publish_written) and keeps the update.
template <class Publish>
ferry_status publish_with(ferry_trainer* t, uint64_t version, const char* null_handle,
                          Publish publish) {
  return guarded([&] {
    if (!t) return refuse(null_handle);
    ferry::trainer::update u(nullptr);
    if (auto s = publish(version, &u); !s) return to_status(s);
    const int fd = t->events;
    u.on_offloaded([fd](const ferry::status&) { signal_fd(fd); });
    u.on_delivered([fd](const ferry::status&) { signal_fd(fd); });
    std::lock_guard lock(t->mutex);
    t->updates.insert_or_assign(version, u);
    return FERRY_OK;
  });
}
}  // namespace

extern "C" {

const char* ferry_status_string(ferry_status s) {
  switch (s) {
    case FERRY_OK:
      return "ok";
    case FERRY_INVALID_ARGUMENT:
      return "invalid argument";
    case FERRY_CLOSED:
      return "closed";
    case FERRY_NOT_JOINED:
      return "not joined";
    case FERRY_ALREADY_JOINED:
      return "already joined";
    case FERRY_BUSY:
      return "busy";
    case FERRY_TIMED_OUT:
      return "timed out";
    case FERRY_UNREACHABLE:
      return "unreachable";
    case FERRY_JOB_FAILED:
      return "job failed";
    case FERRY_UPDATE_FAILED:
      return "update failed";
    case FERRY_INTERNAL:
      return "internal error";
  }
  return "unknown status";
}

const char* ferry_last_error(void) {
  return last_error.c_str();
}

const char* ferry_version(void) {
  return ferry::version_string();
}

ferry_status ferry_set_log_level(const char* level) {
  if (!level) return refuse("ferry_set_log_level: null level");
  return guarded([&] { return to_status(ferry::set_log_level(level)); });
}

ferry_status ferry_clean_up_killed_process(int32_t pid, size_t* removed) {
  return guarded([&] { return to_status(ferry::clean_up_killed_process(pid, removed)); });
}

ferry_status ferry_coordinator_open(const ferry_coordinator_options* o, ferry_coordinator** out) {
  return guarded([&] {
    if (!out) return refuse("ferry_coordinator_open: out is NULL");
    *out = nullptr;
    if (!o || o->struct_size < offsetof(ferry_coordinator_options, stripes) + sizeof(o->stripes)) {
      return refuse(
          "ferry_coordinator_open: options NULL or not set with FERRY_COORDINATOR_OPTIONS_INIT");
    }
    if (o->instances == 0 || !o->instance_sizes)
      return refuse("ferry_coordinator_open: no instance_sizes");
    ferry::coordinator::options cpp{
        .listen = o->listen ? o->listen : "tcp://127.0.0.1:0",
        .secret = o->secret ? o->secret : "",
        .trainers = o->trainers,
        .instance_sizes = {o->instance_sizes, o->instance_sizes + o->instances},
        .chunk_bytes = o->chunk_bytes,
        .depth = o->depth,
        .stripes = o->stripes};
    // Options set by an older ferry.h end before `p2p`.
    if (o->struct_size >= offsetof(ferry_coordinator_options, p2p) + sizeof(o->p2p) && o->p2p)
      cpp.p2p = o->p2p;
    auto handle = std::make_unique<ferry_coordinator>();
    ferry::status ok;
    handle->object.emplace(std::move(cpp), ok);
    if (!ok) return to_status(ok);
    *out = handle.release();
    return FERRY_OK;
  });
}

ferry_status ferry_coordinator_address(ferry_coordinator* c, char* buffer, size_t size) {
  return guarded([&] {
    if (!c || !buffer) return refuse("ferry_coordinator_address: NULL handle or buffer");
    const auto a = c->object->address();
    if (a.size() + 1 > size) return refuse("ferry_coordinator_address: buffer too small");
    std::memcpy(buffer, a.c_str(), a.size() + 1);
    return FERRY_OK;
  });
}

ferry_status ferry_coordinator_wait_delivered(ferry_coordinator* c, uint64_t version,
                                              int64_t timeout_ms) {
  return guarded([&] {
    if (!c) return refuse("ferry_coordinator_wait_delivered: NULL handle");
    return to_status(c->object->wait_delivered(version, ms(timeout_ms)));
  });
}

void ferry_coordinator_close(ferry_coordinator* c) {
  (void)guarded([&] {
    delete c;
    return FERRY_OK;
  });
}

ferry_status ferry_trainer_open(const ferry_member_options* o, ferry_trainer** out) {
  return guarded([&] {
    if (!out) return refuse("ferry_trainer_open: out is NULL");
    *out = nullptr;
    if (!sized(o))
      return refuse("ferry_trainer_open: options NULL or not set with FERRY_MEMBER_OPTIONS_INIT");
    ferry::trainer::options cpp{member(*o)};
    cpp.shard = o->shard;
    *out = new ferry_trainer(std::move(cpp));
    return FERRY_OK;
  });
}

ferry_status ferry_trainer_register_tensor(ferry_trainer* t, const char* name, const char* dtype,
                                           const int64_t* shape, size_t ndim, void* data) {
  return register_tensor_of(t, "ferry_trainer_register_tensor", name, dtype, shape, ndim, data, -1);
}

ferry_status ferry_trainer_register_device_tensor(ferry_trainer* t, const char* name,
                                                  const char* dtype, const int64_t* shape,
                                                  size_t ndim, void* data, int device) {
  return register_tensor_of(t, "ferry_trainer_register_device_tensor", name, dtype, shape, ndim,
                            data, device);
}

ferry_status ferry_trainer_join(ferry_trainer* t) {
  return guarded(
      [&] { return t ? to_status(t->object.join()) : refuse("ferry_trainer_join: NULL handle"); });
}

ferry_status ferry_trainer_wait_ready(ferry_trainer* t, int64_t timeout_ms) {
  return guarded([&] {
    if (!t) return refuse("ferry_trainer_wait_ready: NULL handle");
    return to_status(t->object.wait_ready(ms(timeout_ms)));
  });
}

uint64_t ferry_trainer_next_version(ferry_trainer* t) {
  return t ? t->object.next_version() : 0;
}

ferry_status ferry_trainer_wait_end(ferry_trainer* t, int64_t timeout_ms) {
  return guarded([&] {
    if (!t) return refuse("ferry_trainer_wait_end: NULL handle");
    return to_status(t->object.wait_end(ms(timeout_ms)));
  });
}

ferry_status ferry_trainer_publish(ferry_trainer* t, uint64_t version) {
  return publish_with(
      t, version, "ferry_trainer_publish: NULL handle",
      [&](uint64_t v, ferry::trainer::update* u) { return t->object.publish(v, u); });
}

ferry_status ferry_trainer_publish_written(ferry_trainer* t, uint64_t version) {
  return publish_with(
      t, version, "ferry_trainer_publish_written: NULL handle",
      [&](uint64_t v, ferry::trainer::update* u) { return t->object.publish_written(v, u); });
}

ferry_status ferry_trainer_write(ferry_trainer* t, const char* name, const void* data, size_t bytes,
                                 int64_t timeout_ms) {
  return guarded([&] {
    if (!t || !name || !data) return refuse("ferry_trainer_write: NULL handle, name or data");
    return to_status(
        t->object.write(name, {static_cast<const std::byte*>(data), bytes}, ms(timeout_ms)));
  });
}

ferry_status ferry_trainer_wait_offloaded(ferry_trainer* t, uint64_t version, int64_t timeout_ms) {
  return wait_update(
      t, version, "ferry_trainer_wait_offloaded: NULL handle",
      [&](const ferry::trainer::update& u) { return u.wait_offloaded(ms(timeout_ms)); });
}

ferry_status ferry_trainer_wait_delivered(ferry_trainer* t, uint64_t version, int64_t timeout_ms) {
  return wait_update(
      t, version, "ferry_trainer_wait_delivered: NULL handle",
      [&](const ferry::trainer::update& u) { return u.wait_delivered(ms(timeout_ms)); });
}

int ferry_trainer_event_fd(ferry_trainer* t) {
  return t ? t->events : -1;
}

void ferry_trainer_close(ferry_trainer* t) {
  (void)guarded([&] {
    delete t;
    return FERRY_OK;
  });
}

ferry_status ferry_rollout_open(const ferry_member_options* o, ferry_rollout** out) {
  return guarded([&] {
    if (!out) return refuse("ferry_rollout_open: out is NULL");
    *out = nullptr;
    if (!sized(o))
      return refuse("ferry_rollout_open: options NULL or not set with FERRY_MEMBER_OPTIONS_INIT");
    ferry::rollout::options cpp{member(*o)};
    cpp.instance = o->instance;
    cpp.rank = o->rank;
    auto handle = std::make_unique<ferry_rollout>(std::move(cpp));
    const int fd = handle->events;
    handle->object.on_version([fd](std::uint64_t) { signal_fd(fd); });
    *out = handle.release();
    return FERRY_OK;
  });
}

ferry_status ferry_rollout_register_tensor(ferry_rollout* r, const char* name, const char* dtype,
                                           const int64_t* shape, size_t ndim, void* data) {
  return register_tensor_of(r, "ferry_rollout_register_tensor", name, dtype, shape, ndim, data, -1);
}

ferry_status ferry_rollout_register_rows(ferry_rollout* r, const char* name, const char* dtype,
                                         const int64_t* shape, size_t ndim, int64_t first_row,
                                         int64_t rows, void* data) {
  return guarded([&] {
    if (!r || !name || !dtype || (ndim > 0 && !shape))
      return refuse("ferry_rollout_register_rows: a NULL argument");
    return to_status(
        r->object.register_rows(make_tensor(name, dtype, shape, ndim, data), first_row, rows));
  });
}

ferry_status ferry_rollout_register_device_tensor(ferry_rollout* r, const char* name,
                                                  const char* dtype, const int64_t* shape,
                                                  size_t ndim, void* data, int device) {
  return register_tensor_of(r, "ferry_rollout_register_device_tensor", name, dtype, shape, ndim,
                            data, device);
}

ferry_status ferry_rollout_join(ferry_rollout* r) {
  return guarded(
      [&] { return r ? to_status(r->object.join()) : refuse("ferry_rollout_join: NULL handle"); });
}

uint64_t ferry_rollout_version(ferry_rollout* r) {
  return r ? r->object.version() : 0;
}

ferry_status ferry_rollout_wait_version(ferry_rollout* r, uint64_t version, int64_t timeout_ms) {
  return guarded([&] {
    if (!r) return refuse("ferry_rollout_wait_version: NULL handle");
    return to_status(r->object.wait_version(version, ms(timeout_ms)));
  });
}

ferry_status ferry_rollout_wait_end(ferry_rollout* r, int64_t timeout_ms) {
  return guarded([&] {
    if (!r) return refuse("ferry_rollout_wait_end: NULL handle");
    return to_status(r->object.wait_end(ms(timeout_ms)));
  });
}

int ferry_rollout_event_fd(ferry_rollout* r) {
  return r ? r->events : -1;
}

void ferry_rollout_close(ferry_rollout* r) {
  (void)guarded([&] {
    delete r;
    return FERRY_OK;
  });
}

}  // extern "C"
