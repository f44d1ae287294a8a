#include "jobs/virtual_chaos.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>

#include "actors/coordinator.hpp"
#include "actors/rollout_worker.hpp"
#include "actors/synthetic_model.hpp"
#include "actors/trainer_shard.hpp"
#include "collectives/host/chain_broadcast.hpp"
#include "protocol/protocol.hpp"
#include "runtime/host_buffer.hpp"
#include "runtime/node.hpp"
#include "runtime/virtual_environment.hpp"
#include "transport/factory.hpp"

namespace ferry {

namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

/// The seed's draws. std::mt19937_64 is specified to the bit, so a seed means one run anywhere.
class draws {
 public:
  explicit draws(std::uint64_t seed) : rng_(seed) {}
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  clock::duration up_to(clock::duration d) {
    return clock::duration(below(static_cast<std::uint64_t>(d.count()) + 1));
  }

 private:
  std::mt19937_64 rng_;
};

enum class fault {
  leader_kill,
  double_regroup,
  trainer_kill,
  instance_lost,
  instance_joins,
  instance_leaves,
  silent_kill,
  link_cut
};
constexpr std::uint32_t fault_kinds = 8;
constexpr const char* leader_fault = "leader killed mid-update";
constexpr const char* double_fault = "two regroups within one chunk time";
constexpr const char* trainer_fault = "trainer killed mid-update, rejoined";
constexpr const char* late_fault = "late joiner as the last event";
constexpr const char* instance_fault = "every worker of an instance killed mid-update";
constexpr const char* late_coordinator_fault = "registrations lost: the coordinator started late";
constexpr const char* instance_join_fault = "a new instance joined mid-update";
constexpr const char* instance_leave_fault = "an instance left mid-update";
constexpr const char* silent_fault = "a worker died unannounced, reported by a peer";
constexpr const char* cut_fault = "a member cut off past the heartbeat timeout, readmitted";
constexpr const char* brief_cut_fault = "a member cut off briefly, its frames held";

struct trainer_member {
  node* host = nullptr;
  std::uint32_t shard = 0;
  std::vector<host_buffer> storage;
  std::unique_ptr<trainer_shard> actor;
  bool alive = true;
  bool publishing = false;
  std::uint64_t version = 0;
};

struct worker_member {
  node* host = nullptr;
  std::uint32_t instance = 0, rank = 0;
  std::unique_ptr<rollout_worker> actor;
  bool alive = true;
};

class chaos_job {
 public:
  explicit chaos_job(const virtual_chaos_config& c);
  ~chaos_job();
  virtual_chaos_result run();

 private:
  node& add_node();
  void add_trainer(std::uint32_t shard);
  void add_worker(std::uint32_t instance, std::uint32_t rank);
  void publish_next(trainer_member& t);
  /// Runs `fn` after `delay` of virtual time; the run does not end while one is pending.
  void after(clock::duration delay, std::function<void()> fn);
  void on_update(std::uint64_t version, bool catch_up, const std::vector<node_id>& leaders);
  /// Draws `f`'s moment within an update, and its victim when it comes.
  void inject(fault f, const std::vector<node_id>& leaders);
  /// One per fault kind. Each draws what it needs as it did when first written: a seed's run
  /// depends on the order of the draws.
  void kill_a_leader(clock::duration moment, const std::vector<node_id>& leaders);
  void kill_two_within_a_chunk(clock::duration moment);
  void kill_a_trainer(clock::duration moment);
  void lose_an_instance(clock::duration moment);
  void add_an_instance(clock::duration moment);
  void kill_one_silently(clock::duration moment);
  void cut_a_member_off(clock::duration moment);
  void scale_an_instance_away(clock::duration moment);
  /// `announced`: every node that knows it learns its link broke (tcp), and a replacement joins;
  /// else only those that send or write to it learn (fabric), and none replaces it.
  void kill_worker(worker_member& w, bool announced = true);
  /// Every live worker of `instance` leaves the job for good (an instance scaled away).
  void instance_leaves(std::uint32_t instance);
  /// `member`'s links are cut for `length`, then mended. Cut briefly, its frames and writes arrive
  /// late; cut past the heartbeat timeout, it is given up and must be readmitted. Either way it
  /// must end with everyone's bytes.
  void cut_off(job_member& member, const bool& alive, clock::duration length);
  /// Half the time well within the heartbeat timeout, else well past it (its checks run a
  /// quarter of it apart).
  clock::duration cut_length();
  void note(const std::string& what);
  std::vector<worker_member*> live_workers();
  bool settled();
  void verify();

  virtual_chaos_config config_;
  virtual_chaos_result result_;
  draws draws_;
  std::vector<tensor_spec> model_;
  std::vector<std::vector<tensor_spec>> shards_;
  std::vector<fault> faults_;  ///< still to inject, one per update
  bool late_joiner_ = false;
  bool late_coordinator_ = false;  ///< serves only after the members' first registrations
  clock::duration update_time_{};  ///< the first update's, which scales fault moments

  event_loop loop_;
  virtual_environment env_;
  transport_settings settings_;
  std::vector<std::unique_ptr<node>> nodes_;  ///< every node, the killed ones too, until the end
  std::unique_ptr<job_coordinator> coordinator_;
  std::vector<std::unique_ptr<trainer_member>> trainers_;
  std::vector<std::unique_ptr<worker_member>> workers_;
  std::vector<std::uint32_t> next_rank_;  ///< per instance id: the rank a late joiner takes
  /// Members cut off and mended, with their admissions before the cut: each must be readmitted
  /// unless killed since.
  struct mended {
    job_member* member;
    const bool* alive;
    std::uint64_t admissions;
  };
  std::vector<mended> mended_;
  std::vector<double> regroup_ms_;
  std::uint32_t pending_ = 0;  ///< timed events not yet fired
  std::optional<std::string> failure_;
  bool publishing_done_ = false;
  bool late_joined_ = false;
};

chaos_job::chaos_job(const virtual_chaos_config& c) : config_(c), draws_(c.seed), env_(loop_) {
  if (c.hand_over_messages) settings_.inproc.hand_over_messages();
  result_.seed = c.seed;
  // Drawn whether given or not, so that giving the drawn values changes no later draw.
  constexpr std::uint32_t depths[] = {1, 2, 4};
  const std::uint32_t stripes[] = {1, 2, c.workers_per_instance};
  const auto depth = depths[draws_.below(3)];
  const auto stripe_count = stripes[draws_.below(3)];
  config_.depth = c.depth ? c.depth : depth;
  config_.stripes = c.stripes ? c.stripes : stripe_count;
  result_.depth = config_.depth;
  result_.stripes = config_.stripes;
  model_ = synthetic_transformer(c.model_bytes);
  shards_ = split_over_shards(model_, c.trainers);
  if (!c.trace_path.empty()) env_.trace().keep_records();

  // One fault per update from version 2 on (the first measures the update time): the seed picks
  // the first kind, so every kind comes up across seeds, then up to two more at random.
  faults_.push_back(static_cast<fault>(c.seed % fault_kinds));
  for (std::uint64_t extra = draws_.below(3); extra > 0; --extra)
    faults_.push_back(static_cast<fault>(draws_.below(fault_kinds)));
  late_joiner_ = draws_.below(2) == 0;
  late_coordinator_ = draws_.below(4) == 0;
}

chaos_job::~chaos_job() {
  if (coordinator_) coordinator_->stop_job();
  workers_.clear();
  trainers_.clear();
  coordinator_.reset();
}

node& chaos_job::add_node() {
  const auto id = static_cast<node_id>(nodes_.size());
  auto t = make_transport("inproc", env_, id, settings_);
  nodes_.push_back(std::make_unique<node>(env_, id, *t, protocol()));
  (void)nodes_.back()->start();
  if (id != 0)
    (void)nodes_.back()->transport().add_peer(coordinator_node,
                                              nodes_.front()->transport().local_address());
  return *nodes_.back();
}

void chaos_job::note(const std::string& what) {
  const auto now = env_.clock().now().time_since_epoch().count();
  env_.trace().record({.node = 0, .instant = true, .start_ns = now, .end_ns = now, .label = what});
}

void chaos_job::after(clock::duration delay, std::function<void()> fn) {
  ++pending_;
  env_.clock().async_wait(delay, [this, fn = std::move(fn)](std::error_code) {
    --pending_;
    if (!failure_) fn();
  });
}

void chaos_job::add_trainer(std::uint32_t shard) {
  auto t = std::make_unique<trainer_member>();
  t->host = &add_node();
  t->shard = shard;
  std::vector<tensor_ref> refs;
  for (const auto& s : shards_[shard]) {
    t->storage.emplace_back(s.nbytes);
    refs.push_back({.spec = s, .data = t->storage.back().data()});
  }
  t->actor = std::make_unique<trainer_shard>(*t->host, job_actor, coordinator_->self(), shard, refs,
                                             trainer_options{.checksums = true, .digests = true});
  auto& member = *t;
  member.actor->on_ready = [this, &member] { publish_next(member); };
  member.actor->on_delivered = [this, &member](std::uint64_t v, bool) {
    if (v >= member.version) member.publishing = false;
    publish_next(member);
  };
  member.actor->on_update_failed = [&member](std::uint64_t v, const std::string&) {
    if (v >= member.version) member.publishing = false;
  };
  member.actor->on_failed = [this, &member](const std::string& why) {
    if (member.alive)
      failure_ = "trainer shard " + std::to_string(member.shard) + " failed: " + why;
  };
  member.actor->join();
  trainers_.push_back(std::move(t));
}

void chaos_job::add_worker(std::uint32_t instance, std::uint32_t rank) {
  auto w = std::make_unique<worker_member>();
  w->host = &add_node();
  w->instance = instance;
  w->rank = rank;
  const auto size = config_.workers_per_instance;
  w->actor = std::make_unique<rollout_worker>(
      *w->host, job_actor, coordinator_->self(), instance, rank,
      rollout_share(model_, config_.sharding, rank % size, size),
      worker_options{.checksums = true, .digests = true, .make_broadcast = host_chain(chain_tag)});
  auto& member = *w;
  member.actor->on_failed = [this, &member](const std::string& why) {
    if (member.alive)
      failure_ = fmt::format("worker {}.{} failed: {}", member.instance, member.rank, why);
  };
  member.actor->join();
  workers_.push_back(std::move(w));
}

void chaos_job::publish_next(trainer_member& t) {
  if (t.publishing || !t.alive || publishing_done_ || !t.actor->ready()) return;
  t.publishing = true;
  t.version = std::max(t.version + 1, t.actor->next_version());
  // "Training" makes version v: new bytes in every tensor (free on virtual time).
  for (std::size_t i = 0; i < t.storage.size(); ++i)
    fill_version(t.storage[i].span(), shards_[t.shard][i].name, t.version);
  std::string why;
  if (!t.actor->publish(t.version, why)) failure_ = "publish refused: " + why;
}

std::vector<worker_member*> chaos_job::live_workers() {
  std::vector<worker_member*> live;
  for (auto& w : workers_) {
    if (w->alive) live.push_back(w.get());
  }
  return live;
}

void chaos_job::kill_worker(worker_member& w, bool announced) {
  if (!w.alive) return;
  w.alive = false;
  ++result_.kills;
  const auto& plan = coordinator_->current_plan();
  bool leads = false;
  for (const auto& inst : plan ? plan->instances : std::vector<instance_plan>{}) {
    for (auto l : inst.leaders) leads = leads || inst.workers.at(l).node == w.host->id();
  }
  if (leads) {
    ++result_.leader_kills;
    if (!coordinator_->idle()) {
      ++result_.leader_kills_mid_update;
      ++result_.faults[leader_fault];
    }
  }
  note(fmt::format("kill worker {}.{} (node {})", w.instance, w.rank, w.host->id()));
  settings_.inproc.sever(w.host->id(), announced);
  // A replacement takes its place, as a cluster's launcher would start one; not for an unannounced
  // death, where taking its place would hide whether the coordinator found out.
  if (!announced) return;
  after(microseconds(100) + draws_.up_to(update_time_ * 2),
        [this, instance = w.instance, rank = w.rank] {
          ++result_.joins;
          note(fmt::format("replace worker {}.{}", instance, rank));
          add_worker(instance, rank);
        });
}

void chaos_job::instance_leaves(std::uint32_t instance) {
  note(fmt::format("instance {} leaves", instance));
  for (auto* w : live_workers()) {
    if (w->instance != instance) continue;
    w->alive = false;
    w->actor->leave("instance scaled away");
  }
}

clock::duration chaos_job::cut_length() {
  const clock::duration timeout = job_shape{}.heartbeat_timeout;
  if (draws_.below(2) == 0) return timeout / 8 + draws_.up_to(timeout / 4);
  return timeout * 3 / 2 + draws_.up_to(timeout / 2);
}

void chaos_job::cut_off(job_member& member, const bool& alive, clock::duration length) {
  const auto id = member.host().id();
  note(fmt::format("cut node {} off", id));
  settings_.inproc.cut(id);
  after(length, [this, &member, &alive, id, length, admissions = member.admissions()] {
    note(fmt::format("mend node {}", id));
    settings_.inproc.mend(id);
    if (length < job_shape{}.heartbeat_timeout) {
      ++result_.faults[brief_cut_fault];
    } else {
      mended_.push_back({&member, &alive, admissions});
    }
  });
}

void chaos_job::inject(fault f, const std::vector<node_id>& leaders) {
  const auto moment = draws_.up_to(update_time_);
  switch (f) {
    case fault::leader_kill:
      return kill_a_leader(moment, leaders);
    case fault::double_regroup:
      return kill_two_within_a_chunk(moment);
    case fault::trainer_kill:
      return kill_a_trainer(moment);
    case fault::instance_lost:
      return lose_an_instance(moment);
    case fault::instance_joins:
      return add_an_instance(moment);
    case fault::silent_kill:
      return kill_one_silently(moment);
    case fault::link_cut:
      return cut_a_member_off(moment);
    case fault::instance_leaves:
      return scale_an_instance_away(moment);
  }
}

/// A leader of any instance, the first live one from a drawn pick.
void chaos_job::kill_a_leader(clock::duration moment, const std::vector<node_id>& leaders) {
  after(moment, [this, leaders, pick = draws_.below(leaders.size())] {
    for (std::size_t i = 0; i < leaders.size(); ++i) {
      const auto id = leaders[(pick + i) % leaders.size()];
      for (auto& w : workers_) {
        if (w->alive && w->host->id() == id) return kill_worker(*w);
      }
    }
  });
}

/// The second kill lands before the first regroup's chunk could have crossed one stage.
void chaos_job::kill_two_within_a_chunk(clock::duration moment) {
  const auto chunk_time =
      update_time_ * config_.chunk_bytes / std::max<std::uint64_t>(config_.model_bytes, 1);
  const auto gap = draws_.up_to(chunk_time);
  const auto first = draws_.below(1000), second = draws_.below(1000);
  after(moment, [this, first, second, gap] {
    auto live = live_workers();
    if (live.size() < 2) return;
    auto* a = live[first % live.size()];
    auto* b = live[(first + 1 + second % (live.size() - 1)) % live.size()];
    kill_worker(*a);
    after(gap, [this, b] {
      if (b->alive) ++result_.faults[double_fault];
      kill_worker(*b);
    });
  });
}

/// A trainer shard, killed for real; it rejoins (a new process) a little later.
void chaos_job::kill_a_trainer(clock::duration moment) {
  after(moment, [this, pick = draws_.below(config_.trainers)] {
    trainer_member* victim = nullptr;
    for (auto& t : trainers_) {
      if (t->alive && t->shard == pick) victim = t.get();
    }
    if (!victim) return;
    const bool mid_update = !coordinator_->idle();
    victim->alive = false;
    ++result_.kills;
    ++result_.trainer_kills;
    note(fmt::format("kill trainer shard {} (node {})", victim->shard, victim->host->id()));
    settings_.inproc.sever(victim->host->id());
    after(microseconds(100) + draws_.up_to(update_time_ * 2),
          [this, shard = victim->shard, mid_update] {
            if (mid_update) ++result_.faults[trainer_fault];
            ++result_.joins;
            note(fmt::format("trainer shard {} rejoins", shard));
            add_trainer(shard);
          });
  });
}

/// Every member at once, as when the instance's host goes down.
void chaos_job::lose_an_instance(clock::duration moment) {
  after(moment, [this, pick = draws_.below(config_.instances)] {
    const bool mid_update = !coordinator_->idle();
    bool killed = false;
    for (auto* w : live_workers()) {
      if (w->instance != pick) continue;
      kill_worker(*w);
      killed = true;
    }
    if (killed && mid_update) ++result_.faults[instance_fault];
  });
}

/// Elastic rollout: an instance the job did not start with, caught up from the host copies.
void chaos_job::add_an_instance(clock::duration moment) {
  after(moment, [this] {
    const bool mid_update = !coordinator_->idle();
    const auto instance = static_cast<std::uint32_t>(next_rank_.size());
    next_rank_.push_back(config_.workers_per_instance);
    note(fmt::format("instance {} joins", instance));
    for (std::uint32_t r = 0; r < config_.workers_per_instance; ++r) {
      ++result_.joins;
      add_worker(instance, r);
    }
    if (mid_update) ++result_.faults[instance_join_fault];
  });
}

/// Nobody is told: the coordinator learns from a member whose frame or write found it gone
/// (counted when the regroup says so), not from the heartbeat timeout.
void chaos_job::kill_one_silently(clock::duration moment) {
  after(moment, [this, pick = draws_.below(1000)] {
    auto live = live_workers();
    if (!live.empty()) kill_worker(*live[pick % live.size()], false);
  });
}

/// A worker, or one time in three a trainer shard: the update in flight fails or regroups
/// without it, and it rejoins when its links return.
void chaos_job::cut_a_member_off(clock::duration moment) {
  after(moment, [this, pick = draws_.below(1000), length = cut_length()] {
    if (pick % 3 == 0) {
      for (auto& t : trainers_) {
        if (t->alive && t->shard == pick % config_.trainers)
          return cut_off(*t->actor, t->alive, length);
      }
    }
    auto live = live_workers();
    if (live.empty()) return;
    auto* w = live[pick % live.size()];
    cut_off(*w->actor, w->alive, length);
  });
}

/// A live instance leaves for good, unless it is the last.
void chaos_job::scale_an_instance_away(clock::duration moment) {
  after(moment, [this, pick = draws_.below(1000)] {
    std::vector<std::uint32_t> present;
    for (auto* w : live_workers()) {
      if (std::find(present.begin(), present.end(), w->instance) == present.end())
        present.push_back(w->instance);
    }
    if (present.size() < 2) return;  // the job keeps one instance
    const bool mid_update = !coordinator_->idle();
    instance_leaves(present[pick % present.size()]);
    if (mid_update) ++result_.faults[instance_leave_fault];
  });
}

void chaos_job::on_update(std::uint64_t version, bool catch_up,
                          const std::vector<node_id>& leaders) {
  if (catch_up || version < 2 || faults_.empty()) return;
  const auto f = faults_.front();
  faults_.erase(faults_.begin());
  inject(f, leaders);
}

bool chaos_job::settled() {
  if (!publishing_done_ || pending_ > 0 || !coordinator_->idle()) return false;
  for (auto* w : live_workers()) {
    if (w->actor->version() != result_.delivered) return false;
  }
  if (late_joiner_ && !late_joined_) {
    // The job's last event: a worker joins once everything else is over.
    late_joined_ = true;
    const auto instance = static_cast<std::uint32_t>(draws_.below(next_rank_.size()));
    ++result_.joins;
    ++result_.faults[late_fault];
    note(fmt::format("late joiner {}.{}", instance, next_rank_[instance]));
    add_worker(instance, next_rank_[instance]++);
    return false;
  }
  return true;
}

void chaos_job::verify() {
  std::map<std::string, std::vector<std::byte>> expected;
  for (const auto& t : model_) {
    auto& bytes = expected[t.name];
    bytes.resize(t.nbytes);
    fill_version(bytes, t.name, result_.delivered);
  }
  for (auto* w : live_workers()) {
    for (const auto& t : w->actor->tensors()) {
      const auto part = t.held();
      if (std::memcmp(t.data, expected.at(t.spec.name).data() + part.offset, part.bytes) != 0) {
        failure_ = fmt::format("worker {}.{}: tensor '{}' differs from version {}", w->instance,
                               w->rank, t.spec.name, result_.delivered);
        return;
      }
    }
  }
  for (const auto& m : mended_) {
    if (!*m.alive) continue;
    if (m.member->failed() || m.member->admissions() <= m.admissions) {
      failure_ = fmt::format("node {} was cut off and mended, and never readmitted",
                             m.member->host().id());
      return;
    }
    ++result_.faults[cut_fault];
  }
  if (coordinator_->digest_mismatches() > 0) {
    failure_ = fmt::format("{} update(s) delivered digests that differ from the trainers'",
                           coordinator_->digest_mismatches());
  }
}

virtual_chaos_result chaos_job::run() {
  const auto wall_start = std::chrono::steady_clock::now();
  auto& coordinator_host = add_node();
  std::vector<std::uint32_t> sizes(config_.instances, config_.workers_per_instance);
  next_rank_ = sizes;
  coordinator_ = std::make_unique<job_coordinator>(coordinator_host, job_actor,
                                                   job_shape{.trainers = config_.trainers,
                                                             .instance_sizes = sizes,
                                                             .chunk_bytes = config_.chunk_bytes,
                                                             .depth = config_.depth,
                                                             .stripes = config_.stripes});
  coordinator_->on_failed = [this](const std::string& why) { failure_ = "the job failed: " + why; };
  coordinator_->on_regroup = [this](const regroup_report& r) {
    regroup_ms_.push_back(r.milliseconds);
    if (std::any_of(r.causes.begin(), r.causes.end(),
                    [](const regroup_cause& c) { return c.what == regroup_cause::kind::reported; }))
      ++result_.faults[silent_fault];
  };
  coordinator_->on_update = [this](std::uint64_t v, bool catch_up,
                                   const std::vector<node_id>& leaders) {
    on_update(v, catch_up, leaders);
  };
  coordinator_->on_delivered = [this](const version_report& r) {
    if (update_time_ == clock::duration{}) {
      update_time_ =
          std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(r.seconds));
    }
    if (r.workers == 0) failure_ = fmt::format("version {} delivered to no worker", r.version);
    result_.delivered = std::max(result_.delivered, r.version);
    if (r.version >= config_.versions) publishing_done_ = true;
  };
  if (late_coordinator_) {
    // Its actor drops what arrives before it starts: the members must register again.
    after(std::chrono::milliseconds(50), [this] {
      ++result_.faults[late_coordinator_fault];
      coordinator_->start();
    });
  } else {
    coordinator_->start();
  }
  for (std::uint32_t s = 0; s < config_.trainers; ++s) add_trainer(s);
  for (std::uint32_t i = 0; i < config_.instances; ++i) {
    for (std::uint32_t r = 0; r < config_.workers_per_instance; ++r) add_worker(i, r);
  }

  const auto limit = clock::time_point(std::chrono::duration_cast<clock::duration>(
      std::chrono::duration<double>(config_.virtual_limit_seconds)));
  loop_.run_until([&] { return failure_ || env_.clock().now() > limit || settled(); });
  if (!failure_ && loop_.stalled()) failure_ = "stalled: nothing is ready and no timer is pending";
  if (!failure_ && env_.clock().now() > limit) {
    failure_ = fmt::format("hung: version {} of {} delivered after {} s of virtual time",
                           result_.delivered, config_.versions, config_.virtual_limit_seconds);
  }
  if (!failure_) verify();

  result_.verified = !failure_;
  if (failure_) result_.error = *failure_;
  result_.regroups = coordinator_->regroups();
  if (!regroup_ms_.empty()) {
    std::sort(regroup_ms_.begin(), regroup_ms_.end());
    result_.regroup_ms_median = regroup_ms_[regroup_ms_.size() / 2];
    result_.regroup_ms_max = regroup_ms_.back();
  }
  // What the actors noted (the job's own notes name members: "kill ...", "replace ...").
  for (const auto& [label, times] : env_.trace().instants()) {
    if (!label.starts_with("kill") && !label.starts_with("replace") &&
        !label.starts_with("trainer") && !label.starts_with("late") &&
        !label.starts_with("instance") && !label.starts_with("cut") && !label.starts_with("mend")) {
      result_.faults[label] += static_cast<std::uint32_t>(times);
    }
  }
  result_.trace_digest = env_.trace().digest();
  result_.trace_events = env_.trace().count();
  result_.virtual_seconds =
      std::chrono::duration<double>(env_.clock().now().time_since_epoch()).count();
  if (!config_.trace_path.empty()) {
    if (auto ec = env_.trace().write_chrome(config_.trace_path)) {
      result_.verified = false;
      result_.error = "cannot write the trace to " + config_.trace_path + ": " + ec.message();
    }
  }
  result_.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return result_;
}

}  // namespace

virtual_chaos_result run_virtual_chaos(const virtual_chaos_config& config) {
  return chaos_job(config).run();
}

}  // namespace ferry
