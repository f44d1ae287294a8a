#pragma once
/// The coordinator's update scheduler: the versions the trainers published, the one delivered,
/// those that failed and the one update in flight; which update comes next, and what of it
/// travels to whom. The coordinator acts on its answers: it sends, fails and regroups.
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "actors/membership.hpp"
#include "actors/messages.hpp"
#include "actors/plan.hpp"

namespace ferry {

/// Owning loop only.
class update_scheduler {
 public:
  /// The update in flight: a version, or a catch-up of the delivered one for late joiners.
  struct update {
    std::uint64_t version = 0;
    bool catch_up = false;
  };
  /// A pending version a shard went past without publishing it: it can never complete.
  struct skipped_version {
    std::uint64_t version = 0;
    std::uint32_t shard = 0;
    std::uint64_t shard_published = 0;  ///< the newer version the shard published instead
  };
  /// What of an update must travel in one instance: only what some member lacks.
  struct instance_sends {
    std::vector<std::uint32_t> through_leaders;      ///< chunks the whole instance hears
    std::vector<std::vector<std::uint32_t>> direct;  ///< per rank: chunks only some members hear
  };

  const std::optional<update>& active() const { return active_; }
  std::uint64_t delivered() const { return delivered_; }
  /// Where a member joining now starts: past every version published or delivered.
  std::uint64_t next_version() const { return std::max(published_, delivered_) + 1; }
  /// Published and newer than the delivered one, oldest first (numbers may skip).
  const std::set<std::uint64_t>& pending() const { return pending_; }
  const std::set<std::uint64_t>& failed() const { return failed_; }

  /// `version` began publishing, by trainer shard `shard` when it is a member.
  void published(std::uint64_t version, std::optional<std::uint32_t> shard);
  std::vector<skipped_version> skipped(const job_membership& members) const;
  /// Records `version` failed; false when it already was.
  bool fail(std::uint64_t version) { return failed_.insert(version).second; }

  /// What starts next: late joiners first catch up with the delivered version (unless a shard
  /// rejoined since and holds no copy of it), then the oldest pending version not failed.
  std::optional<update> next(const job_membership& members) const;
  void start(update u) { active_ = u; }
  void abandon() { active_.reset(); }
  /// The active update is done: a version (not a catch-up) is delivered. Returns it.
  update complete();

  /// A chunk the whole of `inst` hears goes to its leaders when some member lacks it; any other
  /// to each member that hears it and lacks it.
  static instance_sends what_travels(const plan& p, const instance_plan& inst,
                                     const job_membership& members, std::uint64_t version);
  /// Each trainer shard's order to send `version` (indexed by shard): every route of `routes`, in
  /// order, each with only the chunks that shard sources, in their order. Every trainer hearing
  /// every route's whole list was most of a simulated update's messages by bytes.
  static std::vector<update_go> orders_by_shard(const plan& p, std::uint64_t version,
                                                std::span<const route_chunks> routes);

 private:
  std::optional<update> active_;
  std::uint64_t delivered_ = 0;
  std::uint64_t published_ = 0;
  std::set<std::uint64_t> pending_;
  std::map<std::uint64_t, std::set<std::uint32_t>>
      publishers_;  ///< the shards that published each pending version
  std::set<std::uint64_t> failed_;
};

}  // namespace ferry
