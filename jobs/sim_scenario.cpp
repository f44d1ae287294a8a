#include "jobs/sim_scenario.hpp"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <charconv>
#include <cmath>
#include <map>
#include <set>

#include "jobs/model_presets.hpp"

namespace ferry {
namespace {

/// Every key a scenario may have, by table.
const std::map<std::string, std::set<std::string>> known = {
    {"hardware",
     {"nodes",
      "gpus_per_node",
      "sockets_per_node",
      "nics_per_node",
      "nic_gbps",
      "pcie_d2h_gbs",
      "pcie_h2d_gbs",
      "pcie_duplex_gbs",
      "host_memory_gbs",
      "nvlink_gbs",
      "peer_access",
      "gpudirect",
      "fabric_oversubscription",
      "copy_threads",
      "copy_thread_gbs",
      "checksum_gbs",
      "gpu_memory_gib",
      "host_memory_gib",
      "pcie_latency_us",
      "nic_latency_us",
      "nvlink_latency_us",
      "copy_latency_us"}},
    {"model", {"preset", "dtype", "bytes"}},
    {"placement",
     {"trainers", "instances", "instance_size", "first_worker_gpu", "trainers_on_host",
      "shard_rollout"}},
    {"ferry", {"chunk", "depth", "stripes", "shared_host_copies", "p2p", "versions", "checksums"}},
    {"events", {"at", "kill", "join", "instance", "rank", "shard"}},
};

struct failure {
  std::string what;
};

/// Reads typed fields out of one table, naming `table.key` in every complaint.
class reader {
 public:
  reader(const toml::table* t, std::string name) : t_(t), name_(std::move(name)) {}

  double number(const char* key, std::optional<double> fallback = std::nullopt) const {
    const auto* node = t_ ? t_->get(key) : nullptr;
    if (!node) {
      if (fallback) return *fallback;
      throw failure{fmt::format("{}.{}: missing", name_, key)};
    }
    if (auto v = node->value<double>()) return *v;
    throw failure{fmt::format("{}.{}: must be a number", name_, key)};
  }
  double positive(const char* key, std::optional<double> fallback = std::nullopt) const {
    const double v = number(key, fallback);
    if (!(v > 0) || !std::isfinite(v))
      throw failure{fmt::format("{}.{}: must be positive", name_, key)};
    return v;
  }
  std::uint32_t count(const char* key, std::optional<double> fallback = std::nullopt) const {
    const double v = number(key, fallback);
    if (v < 0 || v != std::floor(v) || v > 1e9)
      throw failure{fmt::format("{}.{}: must be a whole number", name_, key)};
    return static_cast<std::uint32_t>(v);
  }
  std::optional<std::string> text(const char* key) const {
    const auto* node = t_ ? t_->get(key) : nullptr;
    if (!node) return std::nullopt;
    if (auto v = node->value<std::string>()) return *v;
    throw failure{fmt::format("{}.{}: must be a string", name_, key)};
  }
  std::optional<std::uint64_t> bytes(const char* key) const {
    const auto* node = t_ ? t_->get(key) : nullptr;
    if (!node) return std::nullopt;
    if (auto v = node->value<std::int64_t>(); v && *v > 0) return static_cast<std::uint64_t>(*v);
    if (auto s = node->value<std::string>())
      if (auto b = parse_bytes(*s); b && *b > 0) return b;
    throw failure{fmt::format("{}.{}: must be a byte count such as 64MiB", name_, key)};
  }
  bool flag(const char* key, bool fallback) const {
    const auto* node = t_ ? t_->get(key) : nullptr;
    if (!node) return fallback;
    if (auto v = node->value<bool>()) return *v;
    throw failure{fmt::format("{}.{}: must be true or false", name_, key)};
  }

 private:
  const toml::table* t_;
  std::string name_;
};

void check_keys(const toml::table& root) {
  for (const auto& [k, v] : root) {
    const std::string table(k.str());
    auto it = known.find(table);
    if (it == known.end()) throw failure{fmt::format("{}: unknown table", table)};
    auto check = [&](const toml::table& t, const std::string& where) {
      for (const auto& [key, value] : t)
        if (!it->second.contains(std::string(key.str())))
          throw failure{fmt::format("{}.{}: unknown key", where, key.str())};
    };
    if (table == "events") {
      const auto* list = v.as_array();
      if (!list) throw failure{"events: must be an array of tables ([[events]])"};
      for (std::size_t i = 0; i < list->size(); ++i) {
        const auto* t = list->get(i)->as_table();
        if (!t) throw failure{fmt::format("events[{}]: must be a table", i)};
        check(*t, fmt::format("events[{}]", i));
      }
    } else {
      const auto* t = v.as_table();
      if (!t) throw failure{fmt::format("{}: must be a table", table)};
      check(*t, table);
    }
  }
}

/// `key=value` into the document: the value as TOML when it parses as one, else as a string.
void apply_set(toml::table& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw failure{fmt::format("--set {}: expected key=value", assignment)};
  std::string key = assignment.substr(0, eq);
  const std::string value = assignment.substr(eq + 1);
  if (key.find('.') == std::string::npos) key = "ferry." + key;
  const auto dot = key.find('.');
  const auto table = key.substr(0, dot), field = key.substr(dot + 1);
  if (!known.contains(table) || table == "events" || !known.at(table).contains(field))
    throw failure{fmt::format("--set {}: unknown key", key)};
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed.insert("v", value);
  }
  if (!root.contains(table)) root.insert(table, toml::table{});
  auto* t = root.get(table)->as_table();
  if (!t) throw failure{fmt::format("{}: must be a table", table)};
  t->insert_or_assign(field, *parsed.get("v"));
}

constexpr double giga = 1e9;

/// [hardware]: the cluster's shape and rates.
void fill_hardware(const toml::table& root, sim_config& c) {
  const reader hw(root["hardware"].as_table(), "hardware");
  auto& h = c.hardware;
  h.nodes = hw.count("nodes");
  h.gpus_per_node = hw.count("gpus_per_node");
  h.sockets_per_node = hw.count("sockets_per_node", 1);
  h.nics_per_node = hw.count("nics_per_node", 1);
  h.nic_rate = hw.positive("nic_gbps") * giga / 8;
  h.pcie_d2h_rate = hw.positive("pcie_d2h_gbs") * giga;
  h.pcie_h2d_rate = hw.positive("pcie_h2d_gbs") * giga;
  h.pcie_duplex_rate =
      hw.positive("pcie_duplex_gbs", (h.pcie_d2h_rate + h.pcie_h2d_rate) / giga) * giga;
  h.host_memory_rate = hw.positive("host_memory_gbs") * giga;
  h.nvlink_rate = hw.positive("nvlink_gbs") * giga;
  h.peer_access = hw.flag("peer_access", true);
  h.gpudirect = hw.flag("gpudirect", false);
  h.fabric_oversubscription = hw.number("fabric_oversubscription", 1);
  h.copy_threads = hw.count("copy_threads", 4);
  h.copy_thread_rate = hw.positive("copy_thread_gbs") * giga;
  c.checksum_rate = hw.positive("checksum_gbs", 20) * giga;
  const auto us = [&](const char* key, clock::duration d) {
    return std::chrono::duration_cast<clock::duration>(std::chrono::duration<double, std::micro>(
        hw.number(key, std::chrono::duration<double, std::micro>(d).count())));
  };
  h.pcie_latency = us("pcie_latency_us", h.pcie_latency);
  h.nic_latency = us("nic_latency_us", h.nic_latency);
  h.nvlink_latency = us("nvlink_latency_us", h.nvlink_latency);
  h.copy_latency = us("copy_latency_us", h.copy_latency);
  h.gpu_memory = static_cast<std::uint64_t>(hw.positive("gpu_memory_gib", 80) * (1ull << 30));
  h.host_memory = static_cast<std::uint64_t>(hw.positive("host_memory_gib", 2048) * (1ull << 30));
}

/// [model]: a preset's tensor table, or a byte count cut into tensors.
void fill_model(const toml::table& root, sim_config& c) {
  const reader model(root["model"].as_table(), "model");
  const auto type = model.text("dtype").value_or("bf16");
  if (type != "bf16" && type != "fp8") throw failure{"model.dtype: must be bf16 or fp8"};
  if (auto preset = model.text("preset")) {
    if (model.bytes("bytes")) throw failure{"model.bytes: give a preset or a byte count, not both"};
    auto table = model_preset(*preset, type == "fp8");
    if (!table)
      throw failure{fmt::format("model.preset: unknown model '{}' (known: {})", *preset,
                                fmt::join(model_preset_names(), ", "))};
    c.model = std::move(*table);
  } else if (auto bytes = model.bytes("bytes")) {
    // A byte count: whole tensors of 256 MiB at most, so chunks see realistic packing.
    constexpr std::uint64_t piece = 256ull << 20;
    std::uint64_t left = *bytes;
    for (int i = 0; left > 0; ++i) {
      const auto n = std::min(left, piece);
      c.model.push_back(
          make_tensor_spec(fmt::format("tensor.{}", i), dtype::u8, {static_cast<std::int64_t>(n)}));
      left -= n;
    }
  } else {
    throw failure{"model: give preset or bytes"};
  }
}

/// [placement]: trainers and instances on the cluster's GPUs.
void fill_placement(const toml::table& root, sim_config& c) {
  const reader place(root["placement"].as_table(), "placement");
  c.trainers = place.count("trainers");
  c.instances = place.count("instances");
  c.instance_size = place.count("instance_size");
  c.first_worker_gpu = place.count("first_worker_gpu", 0);
  c.trainers_on_host = place.flag("trainers_on_host", false);
  if (const auto sharding = place.text("shard_rollout")) {
    const auto parsed = parse_rollout_sharding(*sharding);
    if (!parsed)
      throw failure{
          "placement.shard_rollout: \"none\", \"ep\", \"tp\", \"pp-tp\" or \"ep-tp\", not \"" +
          *sharding + "\""};
    c.shard_rollout = *parsed;
  }
}

/// [ferry]: the job's options.
void fill_options(const toml::table& root, sim_config& c) {
  const reader opts(root["ferry"].as_table(), "ferry");
  c.chunk_bytes = opts.bytes("chunk").value_or(default_chunk_bytes);
  c.depth = opts.count("depth", 2);
  c.stripes = opts.count("stripes", 1);
  c.shared_host_copies = opts.flag("shared_host_copies", false);
  if (const auto p2p = opts.text("p2p")) {
    const auto parsed = parse_p2p_mode(*p2p);
    if (!parsed) throw failure{"ferry.p2p: \"auto\", \"device\" or \"host\", not \"" + *p2p + "\""};
    c.p2p = *parsed;
  }
  c.versions = opts.count("versions", 2);
  c.checksums = opts.flag("checksums", true);
}

/// [[events]]: kills and joins at virtual moments.
void fill_events(const toml::table& root, sim_config& c) {
  c.events.clear();
  if (const auto* list = root["events"].as_array()) {
    for (std::size_t i = 0; i < list->size(); ++i) {
      const reader e(list->get(i)->as_table(), fmt::format("events[{}]", i));
      sim_event ev;
      ev.at_seconds = e.number("at");
      if (ev.at_seconds < 0) throw failure{fmt::format("events[{}].at: must not be negative", i)};
      const auto kill = e.text("kill"), join = e.text("join");
      if (kill && *kill == "worker") {
        ev.what = sim_event::kind::kill_worker;
      } else if (kill && *kill == "trainer") {
        ev.what = sim_event::kind::kill_trainer;
        ev.shard = e.count("shard");
        if (ev.shard >= c.trainers)
          throw failure{fmt::format("events[{}].shard: no such trainer shard", i)};
      } else if (join && *join == "worker") {
        ev.what = sim_event::kind::join_worker;
      } else {
        throw failure{
            fmt::format("events[{}]: give kill = \"worker\"|\"trainer\" or join = \"worker\"", i)};
      }
      if (ev.what != sim_event::kind::kill_trainer) {
        ev.instance = e.count("instance");
        ev.rank = e.count("rank");
        if (ev.what == sim_event::kind::kill_worker && ev.rank >= c.instance_size)
          throw failure{fmt::format("events[{}].rank: no such rank", i)};
      }
      c.events.push_back(ev);
    }
  }
}

void fill(const toml::table& root, sim_config& c) {
  fill_hardware(root, c);
  fill_model(root, c);
  fill_placement(root, c);
  fill_options(root, c);
  fill_events(root, c);
  if (auto why = validate(c); !why.empty()) throw failure{why};
}

}  // namespace

std::optional<std::uint64_t> parse_bytes(std::string_view text) {
  double value = 0;
  const auto* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || value < 0) return std::nullopt;
  const std::string unit(p, end);
  static const std::map<std::string, double> units = {{"", 1},
                                                      {"B", 1},
                                                      {"KiB", 1024.0},
                                                      {"MiB", 1048576.0},
                                                      {"GiB", 1073741824.0},
                                                      {"TiB", 1099511627776.0},
                                                      {"KB", 1e3},
                                                      {"MB", 1e6},
                                                      {"GB", 1e9},
                                                      {"TB", 1e12},
                                                      {"k", 1024.0},
                                                      {"K", 1024.0},
                                                      {"M", 1048576.0},
                                                      {"G", 1073741824.0}};
  auto it = units.find(unit);
  if (it == units.end()) return std::nullopt;
  return static_cast<std::uint64_t>(std::llround(value * it->second));
}

std::string load_scenario(const std::string& path, const std::vector<std::string>& sets,
                          sim_config& out) {
  try {
    toml::table root;
    try {
      root = toml::parse_file(path);
    } catch (const toml::parse_error& e) {
      const auto& where = e.source().begin;
      return fmt::format("{}:{}:{}: {}", path, where.line, where.column, e.description());
    }
    for (const auto& s : sets) apply_set(root, s);
    check_keys(root);
    fill(root, out);
    return {};
  } catch (const failure& f) {
    return fmt::format("{}: {}", path, f.what);
  }
}

}  // namespace ferry
