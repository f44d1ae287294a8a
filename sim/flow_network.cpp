#include "sim/flow_network.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "runtime/event_loop.hpp"

namespace ferry::sim {
namespace {

/// Two shares this close are one level (rounding in the subtractions must not split a tie).
constexpr double tie = 1e-9;

double seconds(clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

flow_network::flow_network(event_loop& loop, class clock& clock)
    : loop_(loop), clock_(clock), last_(clock.now()) {}

flow_network::~flow_network() {
  *alive_ = false;
  if (timer_armed_) clock_.cancel(timer_);
}

resource_id flow_network::add_resource(std::string name, double bytes_per_second) {
  if (!(bytes_per_second > 0) || !std::isfinite(bytes_per_second))
    throw std::invalid_argument("resource " + name + ": its rate must be positive and finite");
  resources_.push_back({.name = std::move(name), .bytes_per_second = bytes_per_second});
  capacity_left_.push_back(0);
  unfixed_weight_.push_back(0);
  return static_cast<resource_id>(resources_.size() - 1);
}

std::uint64_t flow_network::start(transfer_spec spec, std::function<void()> done) {
  const auto id = next_id_++;
  ++started_;
  for (const auto& h : spec.path)
    if (h.id >= resources_.size() || !(h.weight > 0))
      throw std::invalid_argument("transfer: a hop names no resource or has no weight");
  if (spec.bytes == 0 || (spec.path.empty() && std::isinf(spec.max_rate))) {
    clock_.async_wait(spec.latency, [done = std::move(done)](std::error_code) { done(); });
    return id;
  }
  advance();
  std::uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    slot = static_cast<std::uint32_t>(flows_.size());
    flows_.emplace_back();
  }
  auto& f = flows_[slot];
  f.id = id;
  f.remaining = static_cast<double>(spec.bytes);
  f.rate = 0;
  f.max_rate = spec.max_rate;
  f.path = std::move(spec.path);
  f.latency = spec.latency;
  f.done = std::move(done);
  for (const auto& h : f.path) ++resources_[h.id].active;
  schedule_recompute();
  return id;
}

double flow_network::rate_of(std::uint64_t transfer) {
  if (recompute_pending_) recompute();
  for (const auto& f : flows_)
    if (f.id == transfer) return f.rate;
  return 0;
}

void flow_network::settle() {
  advance();
}

void flow_network::advance() {
  const auto now = clock_.now();
  const double dt = seconds(now - last_);
  if (dt <= 0) return;
  for (auto& f : flows_) {
    if (f.id == 0 || f.rate == 0) continue;
    f.remaining -= f.rate * dt;
    for (const auto& h : f.path) resources_[h.id].carried_bytes += h.weight * f.rate * dt;
  }
  for (const auto r : touched_)
    if (resources_[r].active > 0) resources_[r].busy += now - last_;
  last_ = now;
}

void flow_network::schedule_recompute() {
  if (recompute_pending_) return;
  recompute_pending_ = true;
  // Later in this same instant: every transfer started or ended now is counted once, together.
  loop_.post([this, alive = alive_] {
    if (*alive && recompute_pending_) recompute();
  });
}

/// Max-min fair shares by progressive filling: raise every unfixed transfer's rate together until
/// a resource (or a transfer's own cap) saturates, fix the transfers it limits, repeat.
void flow_network::recompute() {
  recompute_pending_ = false;
  ++recomputations_;
  advance();
  touched_.clear();
  std::vector<std::uint32_t> unfixed;
  for (std::uint32_t i = 0; i < flows_.size(); ++i) {
    auto& f = flows_[i];
    if (f.id == 0) continue;
    f.rate = 0;
    unfixed.push_back(i);
    for (const auto& h : f.path) {
      if (unfixed_weight_[h.id] == 0) touched_.push_back(h.id);
      unfixed_weight_[h.id] += h.weight;
    }
  }
  for (const auto r : touched_) capacity_left_[r] = resources_[r].bytes_per_second;

  std::vector<std::uint32_t> still;
  while (!unfixed.empty()) {
    double level = std::numeric_limits<double>::infinity();
    for (const auto r : touched_)
      if (unfixed_weight_[r] > 0) level = std::min(level, capacity_left_[r] / unfixed_weight_[r]);
    for (const auto i : unfixed) level = std::min(level, flows_[i].max_rate);
    const double limit = level * (1 + tie);
    still.clear();
    // Decide on this round's shares before subtracting any of them.
    std::vector<std::uint32_t> fixed_now;
    for (const auto i : unfixed) {
      const auto& f = flows_[i];
      bool bound = f.max_rate <= limit;
      for (const auto& h : f.path)
        bound = bound || capacity_left_[h.id] / unfixed_weight_[h.id] <= limit;
      (bound ? fixed_now : still).push_back(i);
    }
    for (const auto i : fixed_now) {
      auto& f = flows_[i];
      f.rate = std::min(level, f.max_rate);
      for (const auto& h : f.path) {
        capacity_left_[h.id] = std::max(0.0, capacity_left_[h.id] - h.weight * f.rate);
        unfixed_weight_[h.id] -= h.weight;
      }
    }
    unfixed.swap(still);
  }
  for (const auto r : touched_) unfixed_weight_[r] = 0, capacity_left_[r] = 0;

  // One timer, at the next completion.
  double soonest = std::numeric_limits<double>::infinity();
  for (const auto& f : flows_)
    if (f.id != 0 && f.rate > 0) soonest = std::min(soonest, std::max(0.0, f.remaining) / f.rate);
  if (timer_armed_) {
    clock_.cancel(timer_);
    timer_armed_ = false;
  }
  if (std::isinf(soonest)) return;
  const auto when =
      clock_.now() + clock::duration(static_cast<std::int64_t>(std::ceil(soonest * 1e9)));
  const auto generation = ++generation_;
  timer_armed_ = true;
  timer_ = clock_.async_wait_until(when, [this, generation, alive = alive_](std::error_code ec) {
    if (!ec && *alive && generation == generation_) on_timer(generation);
  });
}

void flow_network::on_timer(std::uint64_t) {
  timer_armed_ = false;
  advance();
  std::vector<std::function<void()>> finished;
  for (std::uint32_t i = 0; i < flows_.size(); ++i) {
    auto& f = flows_[i];
    // Within a nanosecond's worth of bytes (the clock's grain) counts as arrived.
    if (f.id == 0 || f.rate == 0 || f.remaining > f.rate * 1e-9 + 1e-6) continue;
    for (const auto& h : f.path) --resources_[h.id].active;
    auto done = std::move(f.done);
    if (f.latency > clock::duration::zero()) {
      clock_.async_wait(f.latency, [done = std::move(done)](std::error_code) { done(); });
    } else {
      finished.push_back(std::move(done));
    }
    f = flow{};
    free_.push_back(i);
  }
  schedule_recompute();
  for (auto& done : finished) done();
}

}  // namespace ferry::sim
