#pragma once
/// The per-chunk stages of an update as objects: offload, send and apply each do one step for one
/// chunk through the environment and meter it on the timeline (the broadcast is the collective's
/// own object). The actors compose them; bench/stage_alone runs each alone on the same code, for
/// the bound a whole update is judged against.
#include <functional>
#include <memory>
#include <span>
#include <system_error>
#include <vector>

#include "actors/plan.hpp"
#include "actors/stage_meter.hpp"
#include "actors/tensor.hpp"
#include "runtime/copy_engine.hpp"
#include "runtime/transport.hpp"

namespace ferry {

/// Where one member holds the tensors of a plan: per plan tensor, its index in the member's table
/// (-1: not held), and where each held tensor's bytes start. Made once per plan; members of a
/// process that hold one table share it (`shared`), so a simulation's hundreds of workers keep one.
class tensor_placement {
 public:
  /// `owned_by`: the trainer shard whose tensors `local` holds; another shard's are not placed.
  tensor_placement(const plan_index& job, std::span<const tensor_ref> local,
                   std::optional<std::uint32_t> owned_by = std::nullopt);
  /// The placement of `job` in `local`, one for every caller that passes the same two while any
  /// of them keeps it. Thread-safe.
  static std::shared_ptr<const tensor_placement> shared(
      const std::shared_ptr<const plan_index>& job,
      const std::shared_ptr<const std::vector<tensor_ref>>& local);

  /// The index of plan tensor `tensor` in the member's table, or -1.
  int local_index(std::uint32_t tensor) const { return local_of_[tensor]; }
  /// Byte `offset` of plan tensor `tensor`, which the member holds (its part, when it holds rows).
  std::byte* at(std::uint32_t tensor, std::uint64_t offset) const {
    const auto& p = places_[local_of_[tensor]];
    return p.data + (offset - p.first);
  }

 private:
  /// Per tensor of the member's table, apart from the table, whose entries (names, shapes) span
  /// cache lines: applying a chunk reads one of these per piece.
  struct place {
    std::byte* data = nullptr;
    std::uint64_t first = 0;  ///< the tensor's byte that `data` holds
  };
  std::vector<int> local_of_;  ///< per plan tensor
  std::vector<place> places_;  ///< per tensor of the member's table
};

/// The xxh3-64 of `bytes`, hashed on the environment's executor; then `done(checksum)` on the loop.
/// `bytes` must outlive the call.
void async_chunk_checksum(environment& env, std::span<const std::byte> bytes,
                          std::function<void(std::uint64_t)> done);
/// The same, suspending the calling fiber. Fiber only.
std::uint64_t chunk_checksum(environment& env, std::span<const std::byte> bytes);

/// OFFLOAD: a trainer shard's chunk from its tensors into its host or device copy (or from its
/// device copy into its host copy), then the chunk's checksum. Owning loop only.
class offload_stage {
 public:
  offload_stage(environment& env, node_id node, bool checksums)
      : env_(env), checksums_(checksums), meter_(env, node, stage::offload) {}

  struct outcome {
    std::error_code error;
    bool abandoned = false;      ///< `wanted` said no after a suspension: nothing more was done
    std::uint64_t checksum = 0;  ///< the chunk's xxh3-64; 0 without checksums
  };
  /// Copies chunk `c` of version `version` from the tensors `from` into `stream` (a copy of the
  /// shard, laid out as its packed stream) and hashes it, unless `hash` is false (a device copy's
  /// bytes are not on the host); then `done(outcome)` on the loop. Copies run in the order
  /// started, so a caller keeping several started leaves the copy engine no gap between two
  /// chunks. `wanted` is asked when the copy and the hash end.
  void async_run(const chunk_info& c, const tensor_placement& from, std::span<std::byte> stream,
                 std::uint64_t version, std::function<bool()> wanted, bool hash,
                 std::function<void(outcome)> done);
  /// Chunk `c` its owner wrote into `stream` itself (a written publish): only its checksum, on the
  /// executor; then `done(outcome)` on the loop. `wanted` is asked when the hash ends.
  void async_hash(const chunk_info& c, std::span<const std::byte> stream, std::uint64_t version,
                  std::function<bool()> wanted, std::function<void(outcome)> done);
  /// Fiber only. Copies chunk `c` the same way from `copy`, another copy of the shard laid out
  /// alike (its device copy), and waits; `wanted` is asked after each suspension.
  outcome run(const chunk_info& c, std::span<const std::byte> copy, std::span<std::byte> stream,
              std::uint64_t version, const std::function<bool()>& wanted, bool hash = true);

  stage_meter& meter() { return meter_; }

 private:
  outcome copy(const chunk_info& c, std::vector<copy_piece> pieces, std::uint64_t version,
               const std::function<bool()>& wanted, std::span<const std::byte> hashed);

  environment& env_;
  bool checksums_;
  stage_meter meter_;
};

/// SEND: one chunk (or one leader's stripe of it) from a host copy into a receive slot of a leader,
/// a one-sided write. Owning loop only.
class send_stage {
 public:
  send_stage(environment& env, node_id node, transport& wire)
      : wire_(wire), meter_(env, node, stage::send) {}

  /// Writes `bytes` of chunk `chunk` at `offset` of region `to`, tagged `imm`; then `done(error)`.
  void write(std::span<const std::byte> bytes, const region_desc& to, std::uint64_t offset,
             write_imm imm, std::uint64_t version, std::uint32_t chunk,
             std::function<void(std::error_code)> done);

  stage_meter& meter() { return meter_; }

 private:
  transport& wire_;
  stage_meter meter_;
};

/// APPLY: a chunk from the bytes it arrived in into a member's tensors. Owning loop only.
class apply_stage {
 public:
  apply_stage(environment& env, node_id node) : env_(env), meter_(env, node, stage::apply) {}

  /// Scatters chunk `c` of version `version` from `bytes` into `into`; then `done(error)`. Every
  /// piece lies in what the member holds: the plan cut the segments there.
  void run(const chunk_info& c, const tensor_placement& into, std::span<const std::byte> bytes,
           std::uint64_t version, std::function<void(std::error_code)> done);

  stage_meter& meter() { return meter_; }

 private:
  environment& env_;
  stage_meter meter_;
};

}  // namespace ferry
