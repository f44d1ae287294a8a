#include "cli/report.hpp"

#include <fmt/format.h>

namespace ferry::cli {

std::string summary_table(const job_result& r) {
  std::string out = fmt::format(
      "{:>7} {:>10} {:>9} {:>8} {:>9} | busy s: {:>8} {:>8} {:>9} {:>8} | {}\n", "version", "GB",
      "seconds", "GB/s", "stall s", "offload", "send", "broadcast", "apply", "digests");
  for (const auto& v : r.versions) {
    out += fmt::format(
        "{:>7} {:>10.3f} {:>9.3f} {:>8.2f} {:>9.3f} | {:>16.3f} {:>8.3f} {:>9.3f} {:>8.3f} | {}\n",
        v.version, v.bytes / 1e9, v.seconds, v.bytes / v.seconds / 1e9, v.offloaded_seconds,
        v.busy.offload, v.busy.send, v.busy.broadcast, v.busy.apply, v.verified ? "match" : "-");
  }
  out += fmt::format(
      "{} versions of {:.3f} GB ({} tensors, {} chunks) to {} workers in {:.3f} s: {:.2f} GB/s\n",
      r.versions.size(), r.model_bytes / 1e9, r.tensors, r.chunks, r.workers, r.seconds(),
      r.gbps());
  if (r.worker_bytes > 0 && r.worker_bytes < r.model_bytes) {
    out += fmt::format(
        "sharded: a worker receives at most {:.3f} GB per version ({:.1f}% of the model), at most "
        "{:.3f}x the bytes it holds\n",
        r.worker_bytes / 1e9, 100.0 * r.worker_bytes / r.model_bytes, r.receive_ratio);
  }
  if (const auto& p = r.paths; p.device_direct + p.gpudirect > 0) {
    out += fmt::format(
        "GPU to GPU: of {} trainer-worker pairs, {} read the trainers' device copies on one host, "
        "{} are "
        "written into by GPUDirect RDMA\n",
        p.all, p.device_direct, p.gpudirect);
  }
  out += r.verified ? "verified: every worker holds the trainers' bytes\n"
                    : "NOT verified" + (r.error.empty() ? std::string() : ": " + r.error) + "\n";
  return out;
}

nlohmann::json summary_json(const job_result& r) {
  nlohmann::json versions = nlohmann::json::array();
  for (const auto& v : r.versions) {
    versions.push_back({{"version", v.version},
                        {"seconds", v.seconds},
                        {"stall_seconds", v.offloaded_seconds},
                        {"verified", v.verified},
                        {"busy",
                         {{"offload", v.busy.offload},
                          {"send", v.busy.send},
                          {"upload", v.busy.upload},
                          {"broadcast", v.busy.broadcast},
                          {"apply", v.busy.apply}}}});
  }
  nlohmann::json j{{"verified", r.verified},
                   {"workers", r.workers},
                   {"versions", r.versions.size()},
                   {"bytes", r.model_bytes * r.versions.size()},
                   {"model_bytes", r.model_bytes},
                   {"seconds", r.seconds()},
                   {"gbps", r.gbps()},
                   {"tensors", r.tensors},
                   {"chunks", r.chunks},
                   {"worker_bytes", r.worker_bytes},
                   {"receive_ratio", r.receive_ratio},
                   {"worker_link_bytes", r.worker_link_bytes},
                   {"device_direct_pairs", r.paths.device_direct},
                   {"gpudirect_pairs", r.paths.gpudirect},
                   {"pairs", r.paths.all},
                   {"per_version", versions}};
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

}  // namespace ferry::cli
