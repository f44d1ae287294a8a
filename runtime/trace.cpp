#include "runtime/trace.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <array>
#include <cstdio>
#include <map>
#include <memory>
#include <set>

namespace ferry {

namespace {

constexpr std::array<std::string_view, 6> stage_names{"offload",   "send",  "upload",
                                                      "broadcast", "apply", "verify"};
constexpr int job_track = 100;  ///< instants share one track per node, after the stages

std::string json_escaped(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string_view stage_name(stage s) {
  return stage_names.at(static_cast<std::size_t>(s));
}

void trace::record(trace_record r) {
  // Every field widened to 64 bits: no padding bytes reach the hash.
  const std::array<std::uint64_t, 8> key{r.node,
                                         r.chunk,
                                         r.version,
                                         r.bytes,
                                         static_cast<std::uint64_t>(r.start_ns),
                                         static_cast<std::uint64_t>(r.end_ns),
                                         static_cast<std::uint64_t>(r.what),
                                         r.instant};
  // Chained through the seed: the digest of a record depends on every record before it. One hash
  // per record, two for an instant's label, where three were 1% of a simulation's instructions.
  digest_ = XXH3_64bits_withSeed(key.data(), sizeof key, digest_);
  if (!r.label.empty()) digest_ = XXH3_64bits_withSeed(r.label.data(), r.label.size(), digest_);
  ++count_;
  if (r.instant) ++instants_[r.label];
  if (keep_) records_.push_back(std::move(r));
}

std::error_code trace::write_chrome(const std::string& path) const {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> out(std::fopen(path.c_str(), "w"), &std::fclose);
  if (!out) return {errno, std::generic_category()};
  std::set<std::uint32_t> nodes;
  for (const auto& r : records_) nodes.insert(r.node);
  fmt::print(out.get(), "{{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
  bool first = true;
  auto event = [&](const std::string& e) {
    fmt::print(out.get(), "{}{}", first ? "" : ",\n", e);
    first = false;
  };
  for (auto n : nodes) {
    event(fmt::format(R"({{"ph":"M","name":"process_name","pid":{},"args":{{"name":"node {}"}}}})",
                      n, n));
    for (std::size_t s = 0; s < stage_names.size(); ++s) {
      event(fmt::format(
          R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":"{}"}}}})", n, s,
          stage_names[s]));
    }
    event(fmt::format(
        R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":"job"}}}})", n,
        job_track));
  }
  for (const auto& r : records_) {
    const double ts = r.start_ns / 1e3;
    if (r.instant) {
      event(fmt::format(R"({{"ph":"i","s":"p","name":"{}","pid":{},"tid":{},"ts":{:.3f}}})",
                        json_escaped(r.label), r.node, job_track, ts));
      continue;
    }
    event(fmt::format(
        R"({{"ph":"X","name":"{} v{} c{}","cat":"{}","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},"args":{{"version":{},"chunk":{},"bytes":{}}}}})",
        stage_name(r.what), r.version, r.chunk, stage_name(r.what), r.node,
        static_cast<int>(r.what), ts, (r.end_ns - r.start_ns) / 1e3, r.version, r.chunk, r.bytes));
  }
  fmt::print(out.get(), "\n]}}\n");
  if (std::fflush(out.get()) != 0 || std::ferror(out.get()))
    return {errno ? errno : EIO, std::generic_category()};
  return {};
}

}  // namespace ferry
