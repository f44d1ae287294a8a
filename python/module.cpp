// ferry._ferry: the C++ API (ferry/ferry.hpp) for Python. Tensors come in by DLPack or as a raw
// (pointer, bytes) pair; every wait releases the GIL and wakes every 100 ms to let Ctrl-C in; no
// Python code ever runs on ferry's loop threads (received tensors reach Python through a queue).
// The package around it (ferry/__init__.py) adds torch and numpy conveniences.
#include <dlpack/dlpack.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <ferry/ferry.hpp>
#include <mutex>

namespace py = pybind11;
using namespace std::chrono_literals;

namespace {

/// ferry's exceptions, by api_errc; `Error` is the base of them all.
py::object error_base;
std::map<ferry::api_errc, py::object> error_types;

[[noreturn]] void raise(const ferry::status& s) {
  const auto it = error_types.find(static_cast<ferry::api_errc>(s.code.value()));
  const py::object& type = it != error_types.end() ? it->second : error_base;
  PyErr_SetString(type.ptr(), s.message.c_str());
  throw py::error_already_set();
}

void check(const ferry::status& s) {
  if (!s) raise(s);
}

/// ferry's threads do not survive fork(): an object used from a child would wait forever.
struct fork_guard {
  pid_t owner = getpid();
  void check(const char* what) const {
    if (getpid() != owner) {
      raise({make_error_code(ferry::api_errc::closed),
             std::string(what) + ": created in process " + std::to_string(owner) +
                 ", used in its forked child " + std::to_string(getpid()) +
                 "; ferry cannot cross fork(): create it in the child (or start children with "
                 "spawn)"});
    }
  }
};

/// `fn()` with the GIL released (ferry's calls may wait on its loop thread).
template <class F>
auto without_gil(F fn) {
  py::gil_scoped_release nogil;
  return fn();
}

/// Runs `wait(slice)` without the GIL until it returns anything but timed_out, `timeout` seconds
/// (None: no limit) pass, or a signal handler raises (Ctrl-C).
template <class Wait>
ferry::status wait_interruptibly(std::optional<double> timeout, const std::string& what,
                                 Wait wait) {
  if (timeout && !(*timeout >= 0))
    raise({make_error_code(ferry::api_errc::invalid_argument), what + ": negative timeout"});
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    auto slice = std::chrono::milliseconds(100);
    if (timeout) {
      const auto left =
          std::chrono::duration<double>(*timeout) - (std::chrono::steady_clock::now() - start);
      slice = std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(left), 0ms, slice);
    }
    const ferry::status s = without_gil([&] { return wait(slice); });
    if (s.code != ferry::api_errc::timed_out) return s;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (timeout &&
        std::chrono::steady_clock::now() - start >= std::chrono::duration<double>(*timeout)) {
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%g", *timeout);
      return {s.code, what + ": timed out after " + seconds + " s"};
    }
  }
}

std::chrono::milliseconds seconds(double s) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000));
}

/// A tensor handed to ferry and what keeps its memory alive while ferry holds it.
struct held_tensor {
  ferry::tensor view;
  py::object owner;                    ///< the Python object whose memory `view` points into
  DLManagedTensor* managed = nullptr;  ///< a consumed DLPack capsule, released with this

  held_tensor() = default;
  held_tensor(held_tensor&& o) noexcept
      : view(std::move(o.view)),
        owner(std::move(o.owner)),
        managed(std::exchange(o.managed, nullptr)) {}
  held_tensor& operator=(held_tensor&&) = delete;
  ~held_tensor() {
    if (managed && managed->deleter) managed->deleter(managed);
  }
};

std::string dtype_of(const DLDataType& t, const std::string& name) {
  if (t.lanes == 1) {
    switch (t.code) {
      case kDLFloat:
        if (t.bits == 16) return "f16";
        if (t.bits == 32) return "f32";
        if (t.bits == 64) return "f64";
        break;
      case kDLBfloat:
        if (t.bits == 16) return "bf16";
        break;
      case kDLInt:
        if (t.bits == 8) return "i8";
        if (t.bits == 16) return "i16";
        if (t.bits == 32) return "i32";
        if (t.bits == 64) return "i64";
        break;
      case kDLUInt:
        if (t.bits == 8) return "u8";
        break;
      default:
        break;
    }
  }
  raise({make_error_code(ferry::api_errc::invalid_argument),
         "tensor '" + name + "': dtype (DLPack code " + std::to_string(t.code) + ", " +
             std::to_string(t.bits) + " bits, " + std::to_string(t.lanes) +
             " lanes) is not one ferry knows; pass it raw with a dtype"});
}

/// `obj` through DLPack (`__dlpack__`, or a capsule), checked to be dense and in host memory or
/// a CUDA device's.
held_tensor import_dlpack(const std::string& name, py::object obj) {
  py::object capsule = obj;
  if (py::hasattr(obj, "__dlpack__")) capsule = obj.attr("__dlpack__")();
  if (!PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
    raise({make_error_code(ferry::api_errc::invalid_argument),
           "tensor '" + name + "': not a DLPack tensor (" +
               std::string(py::str(py::type::of(obj).attr("__name__"))) +
               "); pass a torch tensor, a numpy array or register_raw"});
  }
  held_tensor h;
  h.managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");  // the capsule no longer frees it: we do
  h.owner = obj;
  const DLTensor& t = h.managed->dl_tensor;
  const auto type = t.device.device_type;
  if (type != kDLCPU && type != kDLCUDAHost && type != kDLCUDA) {
    raise({make_error_code(ferry::api_errc::invalid_argument),
           "tensor '" + name + "': DLPack device type " + std::to_string(type) +
               "; ferry reads host memory and CUDA devices' memory"});
  }
  std::int64_t expected = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.strides && t.shape[d] > 1 && t.strides[d] != expected) {
      raise({make_error_code(ferry::api_errc::invalid_argument),
             "tensor '" + name + "': not contiguous (dimension " + std::to_string(d) +
                 " has stride " + std::to_string(t.strides[d]) + ", dense is " +
                 std::to_string(expected) + "); pass .contiguous() or a copy"});
    }
    expected *= t.shape[d];
  }
  h.view = {.name = name,
            .dtype = dtype_of(t.dtype, name),
            .shape = std::vector<std::int64_t>(t.shape, t.shape + t.ndim),
            .data = static_cast<std::byte*>(t.data) + t.byte_offset,
            .device = type == kDLCUDA ? t.device.device_id : -1};
  return h;
}

/// A DLPack capsule of `nbytes` bytes of CUDA device `device`'s memory at `data`, as uint8; the
/// consumer (torch.from_dlpack) frees the description, never the memory.
py::capsule device_bytes_capsule(std::byte* data, std::size_t nbytes, int device) {
  struct described {
    DLManagedTensor managed{};
    std::int64_t shape[1]{};
  };
  auto* d = new described;
  d->shape[0] = static_cast<std::int64_t>(nbytes);
  d->managed.dl_tensor = {.data = data,
                          .device = {kDLCUDA, device},
                          .ndim = 1,
                          .dtype = {kDLUInt, 8, 1},
                          .shape = d->shape,
                          .strides = nullptr,
                          .byte_offset = 0};
  d->managed.manager_ctx = d;
  d->managed.deleter = [](DLManagedTensor* m) { delete static_cast<described*>(m->manager_ctx); };
  return py::capsule(&d->managed, "dltensor", [](PyObject* capsule) {
    // Still named "dltensor": no consumer took it, so it is ours to free.
    if (PyCapsule_IsValid(capsule, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
      m->deleter(m);
    }
  });
}

held_tensor import_raw(const std::string& name, std::uintptr_t pointer, std::int64_t nbytes,
                       const std::string& dtype, std::optional<std::vector<std::int64_t>> shape,
                       py::object owner) {
  held_tensor h;
  h.owner = std::move(owner);
  h.view = {.name = name,
            .dtype = dtype,
            .shape = shape ? *shape : std::vector<std::int64_t>{nbytes},
            .data = reinterpret_cast<void*>(pointer)};
  if (!shape && dtype != "u8" && dtype != "i8") {
    raise({make_error_code(ferry::api_errc::invalid_argument),
           "tensor '" + name + "': give the shape of a raw " + dtype + " tensor"});
  }
  return h;
}

class coordinator {
 public:
  coordinator(std::string listen, std::uint32_t trainers, std::vector<std::uint32_t> instance_sizes,
              std::uint64_t chunk_bytes, std::uint32_t depth, std::uint32_t stripes,
              std::string secret, bool allow_unauthenticated, std::string p2p) {
    ferry::status ok;
    impl_ = std::make_unique<ferry::coordinator>(
        ferry::coordinator::options{.listen = std::move(listen),
                                    .secret = std::move(secret),
                                    .allow_unauthenticated = allow_unauthenticated,
                                    .trainers = trainers,
                                    .instance_sizes = std::move(instance_sizes),
                                    .chunk_bytes = chunk_bytes,
                                    .depth = depth,
                                    .stripes = stripes,
                                    .p2p = std::move(p2p)},
        ok);
    check(ok);
  }
  std::string address() const {
    guard_.check("Coordinator");
    return impl_->address();
  }
  std::uint64_t delivered() const {
    guard_.check("Coordinator");
    return impl_->delivered();
  }
  std::uint64_t next_version() const {
    guard_.check("Coordinator");
    return without_gil([&] { return impl_->next_version(); });
  }
  void wait_delivered(std::uint64_t version, std::optional<double> timeout) const {
    guard_.check("Coordinator");
    check(wait_interruptibly(timeout, "Coordinator: waiting for version " + std::to_string(version),
                             [&](auto slice) { return impl_->wait_delivered(version, slice); }));
  }
  void close() {
    if (getpid() != guard_.owner) return;  // a forked child's copy: ferry's threads are not here
    without_gil([&] { impl_->close(); });
  }

 private:
  fork_guard guard_;
  std::unique_ptr<ferry::coordinator> impl_;
};

ferry::member_options member_options(std::string coordinator, std::string secret,
                                     bool allow_unauthenticated, std::uint32_t node_id,
                                     bool checksums, bool digests, double connect_timeout,
                                     std::string listen_host) {
  return {.coordinator = std::move(coordinator),
          .secret = std::move(secret),
          .allow_unauthenticated = allow_unauthenticated,
          .node_id = node_id,
          .checksums = checksums,
          .digests = digests,
          .connect_timeout = seconds(connect_timeout),
          .listen_host = std::move(listen_host)};
}

class update {
 public:
  update(ferry::trainer::update u, fork_guard guard) : impl_(std::move(u)), guard_(guard) {}
  std::uint64_t version() const { return impl_.version(); }
  void wait_offloaded(std::optional<double> timeout) const {
    guard_.check("Update");
    check(wait_interruptibly(timeout,
                             "version " + std::to_string(version()) + ": waiting for its offload",
                             [&](auto slice) { return impl_.wait_offloaded(slice); }));
  }
  void wait_delivered(std::optional<double> timeout) const {
    guard_.check("Update");
    check(wait_interruptibly(timeout,
                             "version " + std::to_string(version()) + ": waiting for its delivery",
                             [&](auto slice) { return impl_.wait_delivered(slice); }));
  }

 private:
  ferry::trainer::update impl_;
  fork_guard guard_;
};

/// What the trainer and rollout wrappers share: tensors registered and held alive while ferry
/// holds them, join, close.
template <class Impl>
class member {
 public:
  void register_tensor(const std::string& name, py::object obj) {
    add(import_dlpack(name, std::move(obj)),
        [&](const ferry::tensor& t) { return impl_->register_tensor(t); });
  }
  void register_raw(const std::string& name, std::uintptr_t pointer, std::int64_t nbytes,
                    const std::string& dtype, std::optional<std::vector<std::int64_t>> shape,
                    py::object owner) {
    add(import_raw(name, pointer, nbytes, dtype, std::move(shape), std::move(owner)),
        [&](const ferry::tensor& t) { return impl_->register_tensor(t); });
  }
  void join() {
    guard_.check(what_);
    check(without_gil([&] { return impl_->join(); }));
  }
  void close() {
    if (getpid() != guard_.owner) return;  // a forked child's copy: ferry's threads are not here
    without_gil([&] { impl_->close(); });
    held_.clear();
  }

 protected:
  member(std::unique_ptr<Impl> impl, const char* what) : what_(what), impl_(std::move(impl)) {}

  /// Registers `h` through `with` (a register call of `impl_`), then keeps it alive.
  template <class Register>
  void add(held_tensor h, Register with) {
    guard_.check(what_);
    check(with(h.view));
    held_.push_back(std::move(h));
  }

  fork_guard guard_;
  const char* what_;  ///< the Python class, for errors
  std::unique_ptr<Impl> impl_;

 private:
  std::deque<held_tensor> held_;
};

class trainer : public member<ferry::trainer> {
 public:
  explicit trainer(ferry::trainer::options o)
      : member(std::make_unique<ferry::trainer>(std::move(o)), "Trainer") {}
  update publish(std::uint64_t version, bool written) {
    guard_.check(what_);
    ferry::trainer::update u(nullptr);
    // Without the GIL: publish waits for the job to be ready.
    check(without_gil([&] {
      return written ? impl_->publish_written(version, &u) : impl_->publish(version, &u);
    }));
    return {std::move(u), guard_};
  }
  /// `obj`'s bytes (host memory) into the version published written, as tensor `name`.
  void write(const std::string& name, py::object obj, std::optional<double> timeout) {
    guard_.check(what_);
    const held_tensor h = import_dlpack(name, std::move(obj));
    if (h.view.device >= 0) {
      raise({make_error_code(ferry::api_errc::invalid_argument),
             "Trainer.write: tensor '" + name + "' is on CUDA device " +
                 std::to_string(h.view.device) + "; a written publish takes host memory"});
    }
    const DLTensor& t = h.managed->dl_tensor;
    std::size_t nbytes = t.dtype.bits / 8;
    for (int d = 0; d < t.ndim; ++d) nbytes *= static_cast<std::size_t>(t.shape[d]);
    const std::span bytes(static_cast<const std::byte*>(h.view.data), nbytes);
    check(wait_interruptibly(timeout, "Trainer.write: tensor '" + name + "'",
                             [&](auto slice) { return impl_->write(name, bytes, slice); }));
  }
};

/// What a rollout streams to Python: a tensor complete, a version complete, or a version failed.
struct rollout_event {
  std::string kind;  ///< "tensor", "version" or "failed"
  std::uint64_t version = 0;
  ferry::tensor tensor;  ///< "tensor": name, dtype, shape, and its bytes in ferry's memory
  std::unique_ptr<std::byte[]> bytes;  ///< a copy of them, when streamed with copies
  std::size_t nbytes = 0;
  std::string reason;  ///< "failed"
};

class rollout : public member<ferry::rollout> {
 public:
  explicit rollout(ferry::rollout::options o)
      : member(std::make_unique<ferry::rollout>(std::move(o)), "Rollout") {}
  /// `obj` holds rows [first_row, first_row + its rows) of the published tensor of `shape`.
  void register_rows(const std::string& name, py::object obj, std::int64_t first_row,
                     std::vector<std::int64_t> shape) {
    auto h = import_dlpack(name, std::move(obj));
    const auto& local = h.view.shape;
    if (local.empty() || shape.size() != local.size() ||
        !std::equal(local.begin() + 1, local.end(), shape.begin() + 1)) {
      check({make_error_code(ferry::api_errc::invalid_argument),
             "Rollout: tensor '" + name +
                 "': its shape must be (rows, *shape[1:]) of the published shape"});
    }
    const auto rows = local[0];
    h.view.shape = std::move(shape);
    add(std::move(h),
        [&](const ferry::tensor& t) { return impl_->register_rows(t, first_row, rows); });
  }
  /// Before join: queue every tensor, version and failure for `next_event`. With `copy`, each
  /// tensor is a copy of its bytes (host memory only); without, a view of ferry's memory, valid
  /// until the next version lands there.
  void stream(bool copy) {
    guard_.check(what_);
    // On the loop thread: copy and queue, never Python.
    impl_->on_tensor(
        [q = queue_, copy](std::uint64_t v, const ferry::tensor& t, std::span<const std::byte> b) {
          rollout_event e{
              .kind = "tensor", .version = v, .tensor = t, .bytes = nullptr, .nbytes = b.size()};
          if (copy && t.device < 0) {
            e.bytes.reset(new std::byte[b.size()]);
            std::memcpy(e.bytes.get(), b.data(), b.size());
          }
          q->push(std::move(e));
        });
    impl_->on_version(
        [q = queue_](std::uint64_t v) { q->push({.kind = "version", .version = v}); });
    impl_->on_update_failed([q = queue_](std::uint64_t v, const ferry::status& why) {
      q->push({.kind = "failed", .version = v, .reason = why.message});
    });
  }
  std::uint64_t version() const {
    guard_.check(what_);
    return impl_->version();
  }
  void wait_version(std::uint64_t version, std::optional<double> timeout) const {
    guard_.check(what_);
    check(wait_interruptibly(timeout, "Rollout: waiting for version " + std::to_string(version),
                             [&](auto slice) { return impl_->wait_version(version, slice); }));
  }
  /// The next streamed event, or None at the timeout: ("tensor", version, name, dtype, shape, its
  /// bytes: a numpy uint8 array, or a DLPack capsule of them on a CUDA device), ("version",
  /// version, ...) or ("failed", version, ..., reason).
  py::object next_event(std::optional<double> timeout) {
    guard_.check(what_);
    std::optional<rollout_event> e;
    auto s = wait_interruptibly(timeout, "Rollout: waiting for the next tensor",
                                [&](auto slice) -> ferry::status {
                                  e = queue_->pop(slice);
                                  if (e) return {};
                                  return {make_error_code(ferry::api_errc::timed_out), ""};
                                });
    if (!e) return py::none();
    if (e->kind != "tensor") {
      return py::make_tuple(e->kind, e->version, py::none(), py::none(), py::none(), e->reason);
    }
    return py::make_tuple(e->kind, e->version, e->tensor.name, e->tensor.dtype, e->tensor.shape,
                          bytes_of(*e));
  }

 private:
  /// A tensor event's bytes for Python, copied no further: a numpy array that owns the copy or
  /// views ferry's host memory, or a capsule of device memory.
  static py::object bytes_of(rollout_event& e) {
    auto* data = static_cast<std::byte*>(e.tensor.data);
    if (e.tensor.device >= 0) return device_bytes_capsule(data, e.nbytes, e.tensor.device);
    py::capsule owner;  // a view: ferry's memory outlives it until the next version
    if (e.bytes) {
      data = e.bytes.release();
      owner = py::capsule(data, [](void* p) { delete[] static_cast<std::byte*>(p); });
    } else {
      owner = py::capsule(data, [](void*) {});
    }
    return py::array_t<std::uint8_t>({static_cast<py::ssize_t>(e.nbytes)}, {py::ssize_t{1}},
                                     reinterpret_cast<std::uint8_t*>(data), owner);
  }

  struct event_queue {
    std::mutex m;
    std::condition_variable cv;
    std::deque<rollout_event> events;
    void push(rollout_event e) {
      std::lock_guard lock(m);
      events.push_back(std::move(e));
      cv.notify_all();
    }
    std::optional<rollout_event> pop(std::chrono::milliseconds timeout) {
      std::unique_lock lock(m);
      if (!cv.wait_for(lock, timeout, [&] { return !events.empty(); })) return std::nullopt;
      auto e = std::move(events.front());
      events.pop_front();
      return e;
    }
  };
  std::shared_ptr<event_queue> queue_ = std::make_shared<event_queue>();
};

}  // namespace

PYBIND11_MODULE(_ferry, m) {
  m.doc() = "ferry's native core; use the `ferry` package";
  m.attr("__version__") = ferry::version_string();
  m.def(
      "set_log_level", [](const std::string& level) { check(ferry::set_log_level(level)); },
      py::arg("level"),
      "How much ferry writes to stderr, process-wide: debug, info (default), warn, error or off.");

  m.def(
      "clean_up_killed_process",
      [](std::int32_t pid) {
        std::size_t removed = 0;
        check(ferry::clean_up_killed_process(pid, &removed));
        return removed;
      },
      py::arg("pid"),
      "Removes the /dev/shm files (libfabric shm's queues) that member process `pid`, killed by "
      "SIGKILL,\n"
      "left; call it once the process died and before reaping it. Returns how many went.");

  error_base = py::reinterpret_steal<py::object>(
      PyErr_NewException("ferry.Error", PyExc_RuntimeError, nullptr));
  m.attr("Error") = error_base;
  const auto add_error = [&](ferry::api_errc e, const char* name, PyObject* also) {
    py::list bases;
    bases.append(error_base);
    if (also) bases.append(py::handle(also));
    auto type = py::reinterpret_steal<py::object>(PyErr_NewException(
        (std::string("ferry.") + name).c_str(), py::tuple(bases).ptr(), nullptr));
    m.attr(name) = type;
    error_types[e] = type;
  };
  using ferry::api_errc;
  add_error(api_errc::invalid_argument, "InvalidArgument", PyExc_ValueError);
  add_error(api_errc::closed, "Closed", nullptr);
  add_error(api_errc::not_joined, "NotJoined", nullptr);
  add_error(api_errc::already_joined, "AlreadyJoined", nullptr);
  add_error(api_errc::busy, "Busy", nullptr);
  add_error(api_errc::timed_out, "TimedOut", PyExc_TimeoutError);
  add_error(api_errc::unreachable, "Unreachable", PyExc_ConnectionError);
  add_error(api_errc::job_failed, "JobFailed", nullptr);
  add_error(api_errc::update_failed, "UpdateFailed", nullptr);
  // The module may be unloaded after these: drop the references at exit, with the GIL.
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    error_types.clear();
    error_base = py::object();
  }));

  py::class_<coordinator>(m, "Coordinator")
      .def(py::init<std::string, std::uint32_t, std::vector<std::uint32_t>, std::uint64_t,
                    std::uint32_t, std::uint32_t, std::string, bool, std::string>(),
           py::kw_only(), py::arg("listen") = "tcp://127.0.0.1:0", py::arg("trainers") = 1,
           py::arg("instance_sizes") = std::vector<std::uint32_t>{1},
           py::arg("chunk_bytes") = ferry::coordinator::options{}.chunk_bytes,
           py::arg("depth") = ferry::coordinator::options{}.depth, py::arg("stripes") = 0,
           py::arg("secret") = "", py::arg("allow_unauthenticated") = false,
           py::arg("p2p") = "auto")
      .def_property_readonly("address", &coordinator::address)
      .def_property_readonly("delivered", &coordinator::delivered)
      .def_property_readonly("next_version", &coordinator::next_version)
      .def("wait_delivered", &coordinator::wait_delivered, py::arg("version"),
           py::arg("timeout") = py::none())
      .def("close", &coordinator::close);

  py::class_<update>(m, "Update")
      .def_property_readonly("version", &update::version)
      .def("wait_offloaded", &update::wait_offloaded, py::arg("timeout") = py::none())
      .def("wait_delivered", &update::wait_delivered, py::arg("timeout") = py::none());

  py::class_<trainer>(m, "Trainer")
      .def(py::init([](std::string coordinator, std::uint32_t shard, std::string secret,
                       bool allow_unauthenticated, std::uint32_t node_id, bool checksums,
                       bool digests, double connect_timeout, std::string listen_host) {
             ferry::trainer::options o;
             static_cast<ferry::member_options&>(o) = member_options(
                 std::move(coordinator), std::move(secret), allow_unauthenticated, node_id,
                 checksums, digests, connect_timeout, std::move(listen_host));
             o.shard = shard;
             return std::make_unique<trainer>(std::move(o));
           }),
           py::kw_only(), py::arg("coordinator"), py::arg("shard") = 0, py::arg("secret") = "",
           py::arg("allow_unauthenticated") = false, py::arg("node_id") = 0,
           py::arg("checksums") = true, py::arg("digests") = true,
           py::arg("connect_timeout") = 30.0, py::arg("listen_host") = "")
      .def("register", &trainer::register_tensor, py::arg("name"), py::arg("tensor"))
      .def("register_raw", &trainer::register_raw, py::arg("name"), py::arg("pointer"),
           py::arg("nbytes"), py::arg("dtype") = "u8", py::arg("shape") = py::none(),
           py::arg("owner") = py::none())
      .def("join", &trainer::join)
      .def("publish", &trainer::publish, py::arg("version"), py::arg("written") = false)
      .def("write", &trainer::write, py::arg("name"), py::arg("tensor"),
           py::arg("timeout") = py::none())
      .def("close", &trainer::close);

  py::class_<rollout>(m, "Rollout")
      .def(py::init([](std::string coordinator, std::uint32_t instance, std::uint32_t rank,
                       std::string secret, bool allow_unauthenticated, std::uint32_t node_id,
                       bool checksums, bool digests, double connect_timeout,
                       std::string listen_host, int device) {
             ferry::rollout::options o;
             static_cast<ferry::member_options&>(o) = member_options(
                 std::move(coordinator), std::move(secret), allow_unauthenticated, node_id,
                 checksums, digests, connect_timeout, std::move(listen_host));
             o.instance = instance;
             o.rank = rank;
             o.device = device;
             return std::make_unique<rollout>(std::move(o));
           }),
           py::kw_only(), py::arg("coordinator"), py::arg("instance") = 0, py::arg("rank") = 0,
           py::arg("secret") = "", py::arg("allow_unauthenticated") = false, py::arg("node_id") = 0,
           py::arg("checksums") = true, py::arg("digests") = true,
           py::arg("connect_timeout") = 30.0, py::arg("listen_host") = "", py::arg("device") = -1)
      .def("register", &rollout::register_tensor, py::arg("name"), py::arg("tensor"))
      .def("register_rows", &rollout::register_rows, py::arg("name"), py::arg("tensor"),
           py::arg("first_row"), py::arg("shape"))
      .def("register_raw", &rollout::register_raw, py::arg("name"), py::arg("pointer"),
           py::arg("nbytes"), py::arg("dtype") = "u8", py::arg("shape") = py::none(),
           py::arg("owner") = py::none())
      .def("stream", &rollout::stream, py::arg("copy") = true)
      .def("join", &rollout::join)
      .def_property_readonly("version", &rollout::version)
      .def("wait_version", &rollout::wait_version, py::arg("version"),
           py::arg("timeout") = py::none())
      .def("next_event", &rollout::next_event, py::arg("timeout") = py::none())
      .def("close", &rollout::close);
}
