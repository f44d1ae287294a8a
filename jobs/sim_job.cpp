#include "jobs/sim_job.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <memory>
#include <optional>

#include "actors/coordinator.hpp"
#include "actors/member_memory.hpp"
#include "actors/rollout_worker.hpp"
#include "actors/synthetic_model.hpp"
#include "actors/trainer_shard.hpp"
#include "collectives/broadcast.hpp"
#include "protocol/protocol.hpp"
#include "runtime/actor.hpp"
#include "runtime/codec.hpp"
#include "runtime/copy_engine.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/host_buffer.hpp"
#include "runtime/node.hpp"
#include "runtime/virtual_environment.hpp"
#include "sim/collective_model.hpp"
#include "sim/copy_model.hpp"
#include "sim/flow_network.hpp"
#include "sim/gpu_memory.hpp"
#include "transport/factory.hpp"

namespace ferry {
namespace {

using sim::route;

clock::duration to_duration(double seconds) {
  return std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
}

/// One member's view of the simulated machine: the shared loop, clock and timeline; CPU work on
/// its node's copy threads and copies on its GPU's links, both as costs; memory that is only sizes.
class member_environment final : public environment {
 public:
  /// `gpu`: this member's GPU of `cluster`; `host`: a memcpy on its node.
  member_environment(virtual_environment& base, sim::flow_network& net, const sim::cluster& cluster,
                     unsigned gpu, route cpu, route host, unsigned threads, double checksum_rate)
      : base_(base),
        cpu_(net, std::move(cpu), threads, checksum_rate),
        copies_(net, cluster, gpu, std::move(host)),
        platform_(base) {}

  event_loop& loop() override { return base_.loop(); }
  class clock& clock() override {
    return base_.clock();
  }
  executor& cpu() override { return cpu_; }
  copy_engine& copies() override { return copies_; }
  class platform& platform() override {
    return platform_;
  }
  class trace& trace() override {
    return base_.trace();
  }
  bool is_virtual() const override { return true; }

 private:
  /// The work itself never runs (its bytes do not exist): it costs its bytes on a copy thread.
  class modelled_executor final : public executor {
   public:
    modelled_executor(sim::flow_network& net, route r, unsigned threads, double rate)
        : net_(net), route_(std::move(r)), threads_(threads) {
      route_.max_rate = std::min(route_.max_rate, rate);
    }
    void async_run(std::uint64_t bytes, std::function<void()>,
                   std::function<void()> done) override {
      net_.start(route_.of(bytes), std::move(done));
    }
    unsigned parallelism() const override { return threads_; }

   private:
    sim::flow_network& net_;
    route route_;
    unsigned threads_;
  };
  class size_only_platform final : public ferry::platform {
   public:
    explicit size_only_platform(environment& base) : base_(base) {}
    bool process_alive(std::int32_t pid) override { return base_.platform().process_alive(pid); }
    /// A simulated trainer's shareable host copy (sim_config::shared_host_copies puts every
    /// member on one host): mapped as size-only addresses of its size.
    result<host_buffer> map_shared(const shared_memory_ref& ref, std::string& why) override {
      if (ref.pid != host_buffer::simulated_pid) return base_.platform().map_shared(ref, why);
      return host_buffer::size_only(ref.bytes);
    }
    /// Blocking work here touches only modelled memory (pinning a size-only buffer): it runs at
    /// once, costs nothing, and completes on the loop.
    void async_blocking(std::function<std::error_code()> work,
                        std::function<void(std::error_code)> done) override {
      base_.loop().post([ec = work(), done = std::move(done)] { done(ec); });
    }
    host_buffer host_memory(std::size_t bytes, bool shareable) override {
      return host_buffer::size_only(bytes, shareable);
    }

   private:
    environment& base_;
  };

  virtual_environment& base_;
  modelled_executor cpu_;
  sim::copy_model copies_;
  size_only_platform platform_;
};

/// What an instance's members share in one epoch: each collective call and who has joined it.
struct sim_group {
  sim::flow_network* net = nullptr;
  std::vector<sim::path> chain, ring;  ///< rank i -> i+1; the ring closes back to 0
  sim::pipeline_model pipeline;
  struct call {
    std::uint32_t joined = 0;
    std::vector<broadcast_group::completion> done;
  };
  std::map<std::uint64_t, call> calls;
  bool aborted = false;
};

/// NCCL's broadcast and all-gather on the model (sim/collective_model): a call starts once every
/// member has made it, as NCCL's does, and completes on every member at once.
class sim_collective final : public broadcast_group {
 public:
  sim_collective(std::shared_ptr<sim_group> group, std::uint32_t rank, std::uint32_t size)
      : group_(std::move(group)), rank_(rank), size_(size) {}
  std::uint32_t rank() const override { return rank_; }
  std::uint32_t size() const override { return size_; }
  void async_broadcast(buffer_ref data, completion done) override {
    join(data.bytes.size(), 1, std::move(done));
  }
  void async_all_gather(buffer_ref data, std::uint32_t stripes, completion done) override {
    join(data.bytes.size(), stripes, std::move(done));
  }
  void abort() override {
    aborted_ = true;
    group_->aborted = true;
    auto calls = std::move(group_->calls);
    group_->calls.clear();
    for (auto& [seq, c] : calls)
      for (auto& d : c.done) d(make_error_code(errc::stopped));
  }

 private:
  void join(std::uint64_t bytes, std::uint32_t stripes, completion done) {
    if (aborted_ || group_->aborted) {
      group_->net->start({}, [done] { done(make_error_code(errc::stopped)); });
      return;
    }
    const auto seq = next_seq_++;
    auto& c = group_->calls[seq];
    c.done.push_back(std::move(done));
    if (++c.joined < size_) return;
    auto finish = [group = group_, seq] {
      auto it = group->calls.find(seq);
      if (it == group->calls.end()) return;  // aborted meanwhile
      auto completions = std::move(it->second.done);
      group->calls.erase(it);
      for (auto& d : completions) d({});
    };
    if (stripes > 1)
      sim::async_ring_all_gather(*group_->net, group_->ring, bytes, group_->pipeline, finish);
    else
      sim::async_chain_broadcast(*group_->net, group_->chain, bytes, group_->pipeline, finish);
  }

  std::shared_ptr<sim_group> group_;
  std::uint32_t rank_, size_;
  std::uint64_t next_seq_ = 0;
  bool aborted_ = false;
};

struct member {
  unsigned gpu = 0;
  std::unique_ptr<member_environment> env;
  std::unique_ptr<sim::gpu_memory> memory;
  std::unique_ptr<node> host;
  std::unique_ptr<trainer_shard> trainer;
  std::unique_ptr<rollout_worker> worker;
  std::uint32_t shard = 0, instance = 0, rank = 0;
  bool alive = true, publishing = false;
  std::uint64_t version = 0;
};

class sim_job {
 public:
  explicit sim_job(const sim_config& c)
      : config_(c),
        env_(loop_),
        net_(loop_, env_.clock()),
        cluster_(net_, c.hardware),
        addresses_(cluster_.gpus()) {
    if (!c.trace_path.empty()) env_.trace().keep_records();
    shards_ = split_over_shards(config_.model, config_.trainers);
    const auto per_node = c.hardware.gpus_per_node;
    first_worker_gpu_ = c.first_worker_gpu || c.trainers_on_host
                            ? c.first_worker_gpu
                            : (c.trainers + per_node - 1) / per_node * per_node;
    settings_.inproc.model_bulk([this](node_id from, node_id to, std::uint64_t bytes,
                                       const std::byte* source, const std::byte* target,
                                       std::function<void()> landed) {
      net_.start(path(from, to, source, target).of(bytes), std::move(landed));
    });
    if (c.hardware.gpudirect) settings_.inproc.reach_device_memory();
    settings_.inproc.model_frames_from(
        1u << 20);                          // plans of large tables; control messages stay instant
    settings_.inproc.hand_over_messages();  // no byte of a message is modelled but its size
  }
  ~sim_job() {
    if (coordinator_) coordinator_->stop_job();
    members_.clear();
    coordinator_.reset();
  }
  sim_result run();

 private:
  /// The way a bulk write from `source` to `target` takes: a NIC's DMA where GPU memory is at
  /// either end (GPUDirect), over NVLink inside a node between workers, else the network.
  route path(node_id from, node_id to, const std::byte* source = nullptr,
             const std::byte* target = nullptr) const {
    const auto a = gpu_of_.at(from), b = gpu_of_.at(to);
    const bool from_device = source && sim::gpu_addresses::on_device(source);
    const bool to_device = target && sim::gpu_addresses::on_device(target);
    if (from_device || to_device) return cluster_.rdma(a, b, from_device, to_device);
    const bool workers = is_worker_.at(from) && is_worker_.at(to);
    return workers ? cluster_.nvlink(a, b) : cluster_.network(a, b);
  }
  node& add_node(unsigned gpu, bool trainer);
  void add_trainer(std::uint32_t shard);
  void add_worker(std::uint32_t instance, std::uint32_t rank);
  std::shared_ptr<const std::vector<tensor_ref>> share_of(std::uint32_t rank, int device);
  /// `p`, simulated device memory just taken; the job fails when a GPU's range was full (null).
  std::byte* taken(std::byte* p) {
    if (!p && !failure_) failure_ = "a GPU's simulated address range is full";
    return p;
  }
  void publish_next(member& t);
  std::unique_ptr<broadcast_group> make_group(actor& owner, const std::vector<address>& members,
                                              std::uint32_t epoch);
  void schedule(const sim_event& e);
  /// The coordinator, on trainer GPU 0's host, with what the result takes from it.
  void start_coordinator();
  /// Runs the loop until the job settles, fails, is stopped or passes the virtual limit, with
  /// progress every `config_.progress_every` of wall time; the failure says which.
  void drive(std::chrono::steady_clock::time_point wall_start);
  /// Each resource's use, the busiest first: the bound and the bottleneck.
  void tally_resources();
  bool settled() const;
  /// Records what the members of `p` hold, and where a node's members need more host memory, or a
  /// GPU's more device memory, than the hardware has.
  void account_memory(const plan& p);

  sim_config config_;
  sim_result result_;
  event_loop loop_{event_loop::posters::own_thread};  // virtual time: nothing else posts
  virtual_environment env_;
  sim::flow_network net_;
  sim::cluster cluster_;
  sim::gpu_addresses addresses_;
  transport_settings settings_;
  std::vector<std::vector<tensor_spec>> shards_;
  unsigned first_worker_gpu_ = 0;
  std::vector<unsigned> gpu_of_;  ///< per node id
  std::vector<bool> is_worker_;   ///< per node id
  std::vector<std::unique_ptr<member>> members_;
  /// By share: a rank in an instance, or 0 for every worker of an unsharded model.
  std::map<std::uint32_t, std::shared_ptr<const std::vector<tensor_ref>>> shares_;
  std::vector<std::vector<tensor_ref>> share_specs_;  ///< what each share holds, all found at once
  std::map<std::pair<std::uint32_t, std::vector<address>>, std::weak_ptr<sim_group>> groups_;
  std::unique_ptr<member> coordinator_member_;
  std::unique_ptr<job_coordinator> coordinator_;
  std::optional<std::string> failure_;
  std::uint64_t delivered_ = 0;
  /// When the first version was delivered, and the timeline's records by then.
  std::pair<std::chrono::steady_clock::time_point, std::uint64_t> first_delivered_;
  std::uint32_t pending_events_ = 0;
};

node& sim_job::add_node(unsigned gpu, bool trainer) {
  const auto id = static_cast<node_id>(gpu_of_.size());
  gpu_of_.push_back(gpu);
  is_worker_.push_back(!trainer);
  auto m = std::make_unique<member>();
  m->gpu = gpu;
  const auto socket = cluster_.socket_of(gpu) % config_.hardware.sockets_per_node;
  const auto memcpy = cluster_.host_copy(cluster_.node_of(gpu), socket);
  auto host_copies = memcpy;  // the copy engine splits a copy over every copy thread
  host_copies.max_rate = std::numeric_limits<double>::infinity();
  m->env =
      std::make_unique<member_environment>(env_, net_, cluster_, gpu, memcpy, host_copies,
                                           config_.hardware.copy_threads, config_.checksum_rate);
  m->memory = std::make_unique<sim::gpu_memory>(addresses_, m->env->platform(), gpu,
                                                cluster_.place_of(gpu));
  auto t = make_transport("inproc", *m->env, id, settings_);
  // A trillion-parameter FP8 model has ~140k tensors: its registration exceeds the default caps
  // of one frame (16 MiB, 65536 array entries), which a real job of that model would meet too.
  codec_limits limits;
  limits.max_frame_bytes = 1u << 30;
  limits.max_array = 1u << 22;
  m->host = std::make_unique<node>(*m->env, id, *t, protocol(), limits);
  (void)m->host->start();
  if (id != coordinator_node)
    (void)m->host->transport().add_peer(coordinator_node, std::to_string(coordinator_node));
  auto& host = *m->host;
  if (id == 0)
    coordinator_member_ = std::move(m);
  else
    members_.push_back(std::move(m));
  return host;
}

void sim_job::add_trainer(std::uint32_t shard) {
  auto& host = add_node(shard, true);
  auto& m = *members_.back();
  m.shard = shard;
  std::vector<tensor_ref> refs;
  for (const auto& s : shards_[shard]) {
    if (config_.trainers_on_host)
      refs.push_back({.spec = s, .data = host_buffer::size_only(s.nbytes).data()});
    else
      refs.push_back({.spec = s,
                      .data = taken(addresses_.take(m.gpu, s.nbytes)),
                      .device = m.memory->device()});
  }
  // On a GPU, the shard's device copies are its GPU's shared memory (device-direct P2P).
  m.trainer = std::make_unique<trainer_shard>(
      host, job_actor, coordinator_->self(), shard, refs,
      trainer_options{.checksums = config_.checksums,
                      .digests = false,
                      .memory = config_.trainers_on_host ? nullptr : m.memory.get()});
  m.trainer->on_ready = [this, &m] { publish_next(m); };
  m.trainer->on_delivered = [this, &m](std::uint64_t v, bool) {
    if (v >= m.version) m.publishing = false;
    publish_next(m);
  };
  m.trainer->on_update_failed = [&m](std::uint64_t v, const std::string&) {
    if (v >= m.version) m.publishing = false;
  };
  m.trainer->on_failed = [this, &m](const std::string& why) {
    if (m.alive) failure_ = fmt::format("trainer shard {} failed: {}", m.shard, why);
  };
  m.trainer->join();
}

void sim_job::add_worker(std::uint32_t instance, std::uint32_t rank) {
  auto& host = add_node(first_worker_gpu_ + instance * config_.instance_size + rank, false);
  auto& m = *members_.back();
  m.instance = instance;
  m.rank = rank;
  m.worker = std::make_unique<rollout_worker>(
      host, job_actor, coordinator_->self(), instance, rank, share_of(rank, m.memory->device()),
      worker_options{
          .checksums = config_.checksums,
          .digests = false,
          .memory = m.memory.get(),
          .make_broadcast = [this](actor& owner, const auto& members, std::uint32_t epoch) {
            return make_group(owner, members, epoch);
          }});
  m.worker->on_failed = [this, &m](const std::string& why) {
    if (m.alive) failure_ = fmt::format("worker {}.{} failed: {}", m.instance, m.rank, why);
  };
  m.worker->join();
}

std::shared_ptr<const std::vector<tensor_ref>> sim_job::share_of(std::uint32_t rank, int device) {
  // A replacement (a rank past the instance size) holds the share of rank % size. Workers of one
  // share hold one table (its addresses are sizes no one touches): a whole-model Kimi-K2 table is
  // 25 MB, times 128 workers. Unsharded, every rank holds the same share, and one table keeps one
  // placement (tensor_placement::shared) for every worker to read per piece applied.
  const auto share =
      config_.shard_rollout == rollout_sharding::none ? 0 : rank % config_.instance_size;
  auto& table = shares_[share];
  if (!table) {
    if (share_specs_.empty()) {
      const auto shares =
          config_.shard_rollout == rollout_sharding::none ? 1 : config_.instance_size;
      share_specs_ = rollout_shares(config_.model, config_.shard_rollout, shares);
    }
    auto destinations = std::move(share_specs_[share]);  // made once: its table is kept below
    for (auto& t : destinations) {
      t.data = taken(addresses_.take_anywhere(t.held().bytes));
      t.device = device;
    }
    table = std::make_shared<const std::vector<tensor_ref>>(std::move(destinations));
  }
  return table;
}

std::unique_ptr<broadcast_group> sim_job::make_group(actor& owner,
                                                     const std::vector<address>& members,
                                                     std::uint32_t epoch) {
  auto& weak = groups_[{epoch, members}];
  auto group = weak.lock();
  if (!group) {
    group = std::make_shared<sim_group>();
    group->net = &net_;
    group->pipeline = {.slice_bytes = 1 << 20, .per_link_latency = config_.hardware.nvlink_latency};
    for (std::size_t i = 0; i + 1 < members.size(); ++i)
      group->chain.push_back(path(members[i].node, members[i + 1].node).path);
    group->ring = group->chain;
    if (members.size() > 1)
      group->ring.push_back(path(members.back().node, members.front().node).path);
    weak = group;
  }
  const auto at = std::find(members.begin(), members.end(), owner.self());
  return std::make_unique<sim_collective>(group, static_cast<std::uint32_t>(at - members.begin()),
                                          static_cast<std::uint32_t>(members.size()));
}

void sim_job::publish_next(member& t) {
  if (t.publishing || !t.alive || !t.trainer->ready()) return;
  const auto next = std::max(t.version + 1, t.trainer->next_version());
  if (next > config_.versions) return;
  t.publishing = true;
  t.version = next;
  std::string why;
  if (!t.trainer->publish(t.version, why)) failure_ = "publish refused: " + why;
}

void sim_job::schedule(const sim_event& e) {
  ++pending_events_;
  env_.clock().async_wait(to_duration(e.at_seconds), [this, e](std::error_code) {
    --pending_events_;
    if (failure_) return;
    if (e.what == sim_event::kind::join_worker) return add_worker(e.instance, e.rank);
    for (auto& m : members_) {
      const bool hit = e.what == sim_event::kind::kill_worker
                           ? m->worker && m->instance == e.instance && m->rank == e.rank
                           : m->trainer && m->shard == e.shard;
      if (!hit || !m->alive) continue;
      m->alive = false;
      ++result_.kills;
      settings_.inproc.sever(m->host->id());
      const auto now = env_.clock().now().time_since_epoch().count();
      env_.trace().record({.node = m->host->id(),
                           .instant = true,
                           .start_ns = now,
                           .end_ns = now,
                           .label = "kill"});
      if (e.what == sim_event::kind::kill_trainer) {
        // A trainer comes back, as its launcher would restart it: the job needs every shard.
        ++pending_events_;
        env_.clock().async_wait(std::chrono::milliseconds(100),
                                [this, shard = e.shard](std::error_code) {
                                  --pending_events_;
                                  if (!failure_) add_trainer(shard);
                                });
      }
      return;
    }
  });
}

void sim_job::account_memory(const plan& p) {
  std::map<unsigned, std::uint64_t> host_of_node, device_of_gpu;
  result_.memory = memory_of(p, [&](const address& who, const member_memory& m) {
    const auto gpu = gpu_of_.at(who.node);
    host_of_node[cluster_.node_of(gpu)] += m.host;
    device_of_gpu[gpu] += m.device;
  });
  const auto gib = [](std::uint64_t bytes) { return static_cast<double>(bytes) / (1ull << 30); };
  const auto& hw = config_.hardware;
  for (const auto& [n, bytes] : host_of_node) {
    if (bytes > hw.host_memory && result_.memory_short.empty())
      result_.memory_short = fmt::format(
          "hardware.host_memory_gib: the members on node {} hold {:.1f} GiB, more than {:.0f} GiB",
          n, gib(bytes), gib(hw.host_memory));
  }
  for (const auto& [g, bytes] : device_of_gpu) {
    if (bytes > hw.gpu_memory && result_.memory_short.empty())
      result_.memory_short = fmt::format(
          "hardware.gpu_memory_gib: the members on GPU {} hold {:.1f} GiB, more than {:.0f} GiB", g,
          gib(bytes), gib(hw.gpu_memory));
  }
}

bool sim_job::settled() const {
  if (delivered_ < config_.versions || pending_events_ > 0 || !coordinator_->idle()) return false;
  for (const auto& m : members_)
    if (m->worker && m->alive && m->worker->version() != delivered_) return false;
  return true;
}

void sim_job::start_coordinator() {
  // The coordinator sits on trainer GPU 0's host; it moves no bulk bytes.
  auto& coordinator_host = add_node(0, true);
  coordinator_ = std::make_unique<job_coordinator>(
      coordinator_host, job_actor,
      job_shape{
          .trainers = config_.trainers,
          .instance_sizes = std::vector<std::uint32_t>(config_.instances, config_.instance_size),
          .chunk_bytes = config_.chunk_bytes,
          .depth = config_.depth,
          .stripes = config_.stripes,
          .shared_host_copies = config_.shared_host_copies,
          .p2p = config_.p2p,
          // Virtual time has no hung processes; a loss is told by the link at once.
          .heartbeat_timeout = std::chrono::hours(24)});
  coordinator_->on_failed = [this](const std::string& why) { failure_ = "the job failed: " + why; };
  coordinator_->on_ready = [this](const plan& p) { account_memory(p); };
  coordinator_->on_delivered = [this](const version_report& r) {
    result_.update_seconds.push_back(r.seconds);
    result_.stall_seconds.push_back(r.offloaded_seconds);
    result_.stage_busy = r.busy;
    delivered_ = std::max(delivered_, r.version);
    const auto now = std::chrono::steady_clock::now();
    if (result_.update_seconds.size() == 1) {
      first_delivered_ = {now, env_.trace().count()};
    } else {
      result_.steady_wall_seconds =
          std::chrono::duration<double>(now - first_delivered_.first).count();
      result_.steady_events = env_.trace().count() - first_delivered_.second;
    }
    if (config_.on_version) config_.on_version(r.version, r.seconds);
  };
  coordinator_->start();
}

void sim_job::drive(std::chrono::steady_clock::time_point wall_start) {
  const auto limit = clock::time_point(to_duration(config_.virtual_limit_seconds));
  auto next_progress = wall_start + config_.progress_every;
  std::uint32_t turns = 0;
  loop_.run_until([&] {
    if (config_.on_progress && ++turns % 4096 == 0 &&
        std::chrono::steady_clock::now() >= next_progress) {
      next_progress = std::chrono::steady_clock::now() + config_.progress_every;
      config_.on_progress(
          std::chrono::duration<double>(env_.clock().now().time_since_epoch()).count(),
          net_.transfers_started());
    }
    return failure_ || env_.clock().now() > limit || config_.stop.stop_requested() || settled();
  });
  if (!failure_ && config_.stop.stop_requested() && !settled()) {
    result_.interrupted = true;
    failure_ = fmt::format("stopped with version {} of {} delivered", delivered_, config_.versions);
  }
  if (!failure_ && loop_.stalled()) failure_ = "stalled: nothing is ready and no timer is pending";
  if (!failure_ && env_.clock().now() > limit)
    failure_ = fmt::format("version {} of {} delivered after {} s of virtual time", delivered_,
                           config_.versions, config_.virtual_limit_seconds);
}

void sim_job::tally_resources() {
  net_.settle();
  result_.virtual_seconds =
      std::chrono::duration<double>(env_.clock().now().time_since_epoch()).count();
  const double versions = std::max<double>(1, static_cast<double>(delivered_));
  for (sim::resource_id id = 0; id < net_.resource_count(); ++id) {
    const auto& r = net_.at(id);
    const auto used = net_.usage(id);
    if (used.carried_bytes <= 0) continue;
    const double busy = std::chrono::duration<double>(used.busy).count();
    result_.resources.push_back(
        {.name = r.name,
         .busy_seconds = busy,
         .utilisation = used.carried_bytes / r.bytes_per_second / result_.virtual_seconds,
         .bytes = used.carried_bytes,
         .bound_seconds = used.carried_bytes / r.bytes_per_second / versions});
  }
  std::stable_sort(result_.resources.begin(), result_.resources.end(),
                   [](const auto& a, const auto& b) { return a.bound_seconds > b.bound_seconds; });
  if (!result_.resources.empty()) {
    result_.bound_seconds = result_.resources.front().bound_seconds;
    result_.bottleneck = result_.resources.front().name;
  }
}

sim_result sim_job::run() {
  const auto wall_start = std::chrono::steady_clock::now();
  start_coordinator();
  for (std::uint32_t s = 0; s < config_.trainers; ++s) add_trainer(s);
  for (std::uint32_t i = 0; i < config_.instances; ++i)
    for (std::uint32_t r = 0; r < config_.instance_size; ++r) add_worker(i, r);
  result_.actors = static_cast<std::uint32_t>(members_.size() + 1);
  for (const auto& e : config_.events) schedule(e);
  drive(wall_start);
  tally_resources();
  if (!result_.update_seconds.empty()) {
    result_.predicted_seconds = result_.update_seconds.back();
    result_.stall = result_.stall_seconds.back();
  }
  result_.delivered = !failure_;
  if (failure_) result_.error = *failure_;
  result_.regroups = coordinator_->regroups();
  result_.transfers = net_.transfers_started();
  result_.trace_events = env_.trace().count();
  if (!config_.trace_path.empty()) {
    if (auto ec = env_.trace().write_chrome(config_.trace_path)) {
      result_.delivered = false;
      result_.error = "cannot write the trace to " + config_.trace_path + ": " + ec.message();
    }
  }
  result_.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return result_;
}

}  // namespace

std::string validate(const sim_config& c) {
  if (auto why = sim::validate(c.hardware); !why.empty()) return why;
  const auto gpus = std::uint64_t{c.hardware.nodes} * c.hardware.gpus_per_node;
  const auto per_node = c.hardware.gpus_per_node;
  const auto trainer_gpus = c.first_worker_gpu || c.trainers_on_host
                                ? c.first_worker_gpu
                                : (std::uint64_t{c.trainers} + per_node - 1) / per_node * per_node;
  if (c.trainers == 0) return "placement.trainers: must be at least 1";
  if (c.instances == 0) return "placement.instances: must be at least 1";
  if (c.instance_size == 0) return "placement.instance_size: must be at least 1";
  if (c.first_worker_gpu != 0 && c.first_worker_gpu < c.trainers && !c.trainers_on_host)
    return "placement.first_worker_gpu: must come after the trainers' GPUs";
  if (trainer_gpus + std::uint64_t{c.instances} * c.instance_size > gpus)
    return fmt::format(
        "placement: {} trainer GPUs (whole nodes) and {} instances of {} need more than the {} "
        "GPUs "
        "of hardware.nodes x hardware.gpus_per_node",
        c.trainers, c.instances, c.instance_size, gpus);
  if (c.model.empty()) return "model: no tensors";
  if (c.chunk_bytes == 0) return "ferry.chunk: must be at least 1 byte";
  if (c.depth == 0) return "ferry.depth: must be at least 1";
  if (c.stripes == 0 || c.stripes > c.instance_size)
    return "ferry.stripes: must be between 1 and the instance size";
  if (c.versions == 0) return "ferry.versions: must be at least 1";
  if (c.shared_host_copies &&
      trainer_gpus + std::uint64_t{c.instances} * c.instance_size > per_node)
    return "ferry.shared_host_copies: every trainer and rollout GPU must be on one node "
           "(hardware.gpus_per_node)";
  for (const auto& e : c.events)
    if (e.what != sim_event::kind::kill_trainer && e.instance >= c.instances)
      return fmt::format("events: instance {} does not exist", e.instance);
  return {};
}

sim_result run_sim(const sim_config& config) {
  return sim_job(config).run();
}

}  // namespace ferry
