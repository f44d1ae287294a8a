#pragma once
/// Each stage of a weight update measured alone, for the bound a pipelined update is judged
/// against: the actors' own stage objects (actors/stages.hpp) and chain, on the same chunk table,
/// copy pool, transport and window as a job, but one stage at a time, so the whole update can be
/// compared with its slowest stage in the same run.
#include <cstdint>
#include <stop_token>
#include <string>

#include "runtime/errc.hpp"

namespace ferry::bench {

/// The job shape the stages are measured for.
struct stage_shape {
  std::uint32_t trainers = 2;
  std::uint32_t instances = 1;
  std::uint32_t workers_per_instance = 3;
  std::uint64_t model_bytes = 512ull << 20;
  std::uint64_t chunk_bytes = 16ull << 20;
  std::uint32_t depth = 2;
  std::string transport = "inproc";
  bool checksums = false;  ///< xxh3 of each offloaded chunk: off, as in ferry bench's jobs
};

/// Wall seconds of each stage alone, for one version of the model.
struct stage_seconds {
  double offload = 0;  ///< every shard's tensors into its host copy, chunk by chunk, shards at once
  double send = 0;     ///< every shard's chunks to every leader, `depth` writes in flight per route
  double broadcast =
      0;             ///< the chain over the transport across one instance, `depth` chunks in flight
  double apply = 0;  ///< every worker scatters every chunk into its tensors, `depth` in flight

  double slowest() const;
  /// The name of the slowest stage ("offload", "send", "broadcast", "apply").
  const char* slowest_name() const;
  /// What a strictly serial update (one stage after another) would take.
  double sum() const;
};

/// Measures every stage `repeats` times (after a warm-up of the links) on a thread of its own
/// with its own event loop, and returns each stage's median. Memory is allocated and faulted in
/// before timing and freed on return. Call with no job running; `why` says what failed. A stop
/// requested on `stop` ends it within a stage's operations in flight (`why`: "stopped").
result<stage_seconds> measure_stages(const stage_shape& shape, int repeats, std::string& why,
                                     std::stop_token stop = {});

}  // namespace ferry::bench
