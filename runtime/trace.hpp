#pragma once
/// The timeline: every stage of every chunk (start, end, bytes, node) and the job's events
/// (regroups, kills), recorded through the clock. Written as Chrome trace JSON, which Perfetto
/// opens, for real and simulated runs alike; hashed in order, so two runs can be compared event
/// for event.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace ferry {

/// The stages of one chunk's trip, in pipeline order: each has a track per node.
enum class stage : std::uint8_t { offload, send, upload, broadcast, apply, verify };
std::string_view stage_name(stage s);

/// One operation of a stage, or (`instant`) one event of the job.
struct trace_record {
  std::uint32_t node = 0;
  stage what = stage::offload;
  bool instant = false;
  std::uint64_t version = 0;
  std::uint32_t chunk = 0;
  std::uint64_t bytes = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  std::string label;  ///< instants: what happened
};

/// Owning loop only.
class trace {
 public:
  /// Keeps the records (for `write_chrome`) from now on; the digest is kept either way.
  void keep_records() { keep_ = true; }
  void record(trace_record r);
  /// XXH3-64 of every record so far, in order.
  std::uint64_t digest() const { return digest_; }
  std::uint64_t count() const { return count_; }
  /// How often each instant happened, by label (kept whether or not the records are).
  const std::map<std::string, std::uint64_t>& instants() const { return instants_; }
  const std::vector<trace_record>& records() const { return records_; }
  /// Chrome trace JSON: one process per node, one thread per stage, instants on a "job" track.
  std::error_code write_chrome(const std::string& path) const;

 private:
  bool keep_ = false;
  std::uint64_t digest_ = 0;
  std::uint64_t count_ = 0;
  std::vector<trace_record> records_;
  std::map<std::string, std::uint64_t> instants_;
};

}  // namespace ferry
