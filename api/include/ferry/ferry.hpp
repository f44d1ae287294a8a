#pragma once
/// ferry's public C++ API. A `coordinator` runs a job; each trainer process opens a `trainer` for
/// its shard and publishes versions of its tensors; each rollout process opens a `rollout` for its
/// (instance, rank) and receives every version. Each object runs its own event-loop thread: every
/// member function may be called from any thread, and callbacks run on that loop thread (keep them
/// short). Closing, or destroying, a trainer or rollout leaves the job (the others regroup).
///
/// Addresses name the transport: "tcp://host:port" (authenticated by the job secret),
/// "cma://host:port" (tcp links, same-host bulk copies), "fabric://provider" (libfabric; the
/// coordinator's reply to `address()` is what members pass), "inproc://NAME" (the objects of one
/// process, no secret needed). The job secret comes from `options::secret`, else from
/// FERRY_SECRET_FILE or FERRY_SECRET.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 2
#define FERRY_VERSION_PATCH 0

#if defined(FERRY_BUILDING_LIBRARY)
#define FERRY_API __attribute__((visibility("default")))
#else
#define FERRY_API
#endif

namespace ferry {

/// "major.minor.patch" of the library loaded (which may be newer than the headers).
FERRY_API const char* version_string() noexcept;

struct status;
/// How much ferry writes to stderr, for the whole process: "debug", "info" (the default),
/// "warn", "error" or "off". FERRY_LOG sets it at start.
FERRY_API status set_log_level(const std::string& level);

/// Removes what a member process killed by SIGKILL (by a launcher, by the OOM killer) left on this
/// host for good: libfabric shm's queues, a 16 MiB file of /dev/shm per endpoint, which the
/// provider removes only on a close or a signal it can catch. A launcher other than `ferry local`
/// calls it once such a process has died and before reaping it (waitpid), while its pid cannot
/// name another process. `removed`, if given: how many files went. Refuses a process that runs.
FERRY_API status clean_up_killed_process(std::int32_t pid, std::size_t* removed = nullptr);

/// Errors of the API; `std::error_code`s of `api_category()`, each returned with a message.
enum class api_errc : int {
  invalid_argument = 1,  ///< a bad option, tensor, version or address
  closed,                ///< the object was closed, or the job stopped
  not_joined,            ///< the call needs a joined member
  already_joined,        ///< registering after the job started
  busy,                  ///< the previous version is still offloading
  timed_out,             ///< a wait passed its timeout
  unreachable,           ///< the coordinator could not be reached
  job_failed,            ///< the job failed (its reason is in the message)
  update_failed,         ///< this version cannot be delivered (a member died mid-update)
};
FERRY_API const std::error_category& api_category() noexcept;
inline std::error_code make_error_code(api_errc e) noexcept {
  return {static_cast<int>(e), api_category()};
}

/// An outcome: no error, or an error code and what happened, naming the culprit.
struct status {
  std::error_code code;
  std::string message;
  explicit operator bool() const noexcept { return !code; }  ///< true: success
};

/// A tensor as ferry sees it: where its bytes are and what they mean. `dtype` is one of u8, i8,
/// i16, i32, i64, f16, bf16, f32, f64, fp8_e4m3, fp8_e5m2; `data` is host memory, or memory of
/// CUDA device `device` (CUDA builds; every tensor of one member on the same device: its copies
/// run on that GPU's streams, and rollouts of an instance on GPUs share it over NCCL). ferry never
/// frees it.
struct tensor {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  void* data = nullptr;
  int device = -1;
};

/// Options every member shares.
struct member_options {
  std::string coordinator;  ///< the coordinator's address (`coordinator::address()`)
  std::string
      secret;  ///< the job secret (at least 16 bytes); empty: FERRY_SECRET_FILE / FERRY_SECRET
  bool allow_unauthenticated = false;  ///< tcp without a secret (tests only)
  std::uint32_t node_id =
      0;                  ///< unique in the job; 0 derives one from the shard or (instance, rank)
  bool checksums = true;  ///< xxh3-64 per chunk, checked by every receiver
  bool digests = true;    ///< xxh3-128 per tensor, for the coordinator's verdict
  std::chrono::milliseconds connect_timeout{30000};  ///< join gives up after this
  /// The local address other members reach this one at (tcp, cma; fabric: the node its endpoint
  /// opens on). Empty: over tcp and cma, the address this host reaches the coordinator from
  /// (another host's members can connect); over fabric, loopback.
  std::string listen_host;
  /// Where this member writes its timeline when it closes (Chrome trace JSON, one track per
  /// stage); empty: none.
  std::string trace_file;
};

/// Runs a job: admits members, plans, and drives one update at a time.
class FERRY_API coordinator {
 public:
  struct options {
    std::string listen = "tcp://127.0.0.1:0";  ///< port 0 picks a free one
    std::string secret;
    bool allow_unauthenticated = false;
    std::uint32_t trainers = 1;
    std::vector<std::uint32_t> instance_sizes{1};  ///< workers per rollout instance
    std::uint64_t chunk_bytes = 64ull << 20;
    std::uint32_t depth = 2;    ///< chunks in flight per stage
    std::uint32_t stripes = 0;  ///< leaders per instance; 0: one (every member on GPUs)
    /// How chunks go between a trainer and a rollout whose tensors are both on GPUs: "auto" (GPU
    /// to GPU on one host where the rollout's GPU can read the trainer's, else through host
    /// memory), "device" (GPU to GPU wherever both share a host) or "host".
    std::string p2p = "auto";
  };
  /// Starts listening; `ok` says whether it did and why not.
  coordinator(options o, status& ok);
  ~coordinator();
  coordinator(const coordinator&) = delete;
  coordinator& operator=(const coordinator&) = delete;

  /// What members pass as `member_options::coordinator`.
  std::string address() const;
  /// The newest version delivered to every worker (0: none yet).
  std::uint64_t delivered() const;
  /// The version the job takes next: newer than every version a trainer published or the job
  /// delivered (1 before any, and once closed).
  std::uint64_t next_version() const;
  /// Waits until `version` is delivered, the job fails, or `timeout` passes.
  status wait_delivered(std::uint64_t version, std::chrono::milliseconds timeout) const;
  /// Tells every member the job is over and stops.
  void close();

 private:
  status open(options o);
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// One trainer shard: registers its tensors, joins, and publishes versions of them.
class FERRY_API trainer {
 public:
  struct options : member_options {
    std::uint32_t shard = 0;
  };
  /// One published version: wait for (or be told of) its offload and its delivery.
  class FERRY_API update {
   public:
    std::uint64_t version() const;
    /// Until the tensors are copied out (they may be written again then), or the timeout.
    status wait_offloaded(std::chrono::milliseconds timeout) const;
    /// Until every worker holds the version (or it failed), or the timeout.
    status wait_delivered(std::chrono::milliseconds timeout) const;
    /// Called once, on the trainer's loop thread (at once if already so).
    void on_offloaded(std::function<void(const status&)> fn) const;
    void on_delivered(std::function<void(const status&)> fn) const;

    struct state;
    explicit update(std::shared_ptr<state> s) : state_(std::move(s)) {}

   private:
    std::shared_ptr<state> state_;
  };

  explicit trainer(options o);
  ~trainer();
  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

  /// Before `join` only. The name must be unique; the size follows from dtype and shape.
  status register_tensor(const tensor& t);
  /// Connects and registers the tensors.
  status join();
  /// Until the coordinator admitted this shard and the job is ready for a version from it, the
  /// job fails or ends, or the timeout.
  status wait_ready(std::chrono::milliseconds timeout) const;
  /// The lowest version the job takes next from this shard, as of its last readiness: a shard
  /// that joins a running job (a replacement) continues from there. 1 before.
  std::uint64_t next_version() const;
  /// Publishes `version` (newer than every version before) of the registered tensors; waits for
  /// the job to be ready first. Refused while the previous version is still offloading.
  status publish(std::uint64_t version, update* out = nullptr);
  /// Publishes `version` from bytes given to `write` instead of the registered tensors (which then
  /// only name the table): each chunk leaves as soon as every tensor in it is written, so the
  /// caller's one copy of each byte overlaps the sends of the chunks before. Tensors in host
  /// memory; the update is offloaded once every tensor is written and hashed.
  status publish_written(std::uint64_t version, update* out = nullptr);
  /// Copies tensor `name`'s bytes (`bytes`, its registered size) into the version
  /// `publish_written` publishes, once ferry's copy of it may be written; on timeout nothing was
  /// written. Each tensor once per version, from one thread, not beside `close`.
  status write(const std::string& name, std::span<const std::byte> bytes,
               std::chrono::milliseconds timeout);
  /// Until the coordinator ends the job (success), the job fails, or the timeout.
  status wait_end(std::chrono::milliseconds timeout) const;
  /// Leaves the job (idempotent); `reason` is what the coordinator logs and regroups for.
  void close(const std::string& reason = "closed");

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// One rollout worker: says where each tensor lands, joins, and receives every version.
class FERRY_API rollout {
 public:
  struct options : member_options {
    std::uint32_t instance = 0;
    std::uint32_t rank = 0;
    /// A rollout that registers nothing keeps the trainers' tensors in this CUDA device's memory
    /// (`on_tensor` then hands out device pointers); -1: host memory. Registered tensors say
    /// where they are themselves.
    int device = -1;
  };
  explicit rollout(options o);
  ~rollout();
  rollout(const rollout&) = delete;
  rollout& operator=(const rollout&) = delete;

  /// Before `join` only: where `t` lands (`t.data`), or, with a null `data`, ferry keeps the
  /// bytes and hands them to `on_tensor`. Name, dtype and shape must match the trainers'.
  /// A rollout that registers nothing receives whatever the trainers publish, in memory ferry
  /// keeps, through `on_tensor`. One that registers some tensors receives only those (an expert-
  /// parallel shard); the workers of each instance must together register every published byte.
  status register_tensor(const tensor& t);
  /// Before `join` only: rows [first_row, first_row + rows) of `t` (its first dimension; `t.shape`
  /// is the whole published shape), for row-parallel sharding. `t.data` holds those rows only,
  /// and only their bytes are sent here. One range per tensor.
  status register_rows(const tensor& t, std::int64_t first_row, std::int64_t rows);
  /// A tensor of a version is complete here: its version, its name, dtype and shape, and its bytes
  /// (`t.data`, on `t.device` when the rollout's tensors are; valid during the call only). For a
  /// row range, `t.shape[0]` is its row count.
  void on_tensor(
      std::function<void(std::uint64_t version, const tensor& t, std::span<const std::byte>)> fn);
  /// Every tensor of a version is applied here. No later version lands here while `fn` runs (the
  /// job waits for it), so it may read the registered tensors as one consistent version.
  void on_version(std::function<void(std::uint64_t version)> fn);
  /// A version cannot be delivered (a member died mid-update); what arrived of it is dropped.
  void on_update_failed(std::function<void(std::uint64_t version, const status& why)> fn);
  /// Connects and registers (before any `on_*` callback can run, set them).
  status join();
  /// The newest version applied here (0: none).
  std::uint64_t version() const;
  /// Waits until `version` (or a newer one) is applied here, it fails (update_failed), the job
  /// fails or ends, or `timeout` passes.
  status wait_version(std::uint64_t version, std::chrono::milliseconds timeout) const;
  /// Until the coordinator ends the job (success), the job fails, or the timeout.
  status wait_end(std::chrono::milliseconds timeout) const;
  /// Leaves the job (idempotent); `reason` is what the coordinator logs and regroups for.
  void close(const std::string& reason = "closed");

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace ferry

template <>
struct std::is_error_code_enum<ferry::api_errc> : std::true_type {};
