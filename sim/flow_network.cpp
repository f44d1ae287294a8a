#include "sim/flow_network.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "runtime/event_loop.hpp"

namespace ferry::sim {
namespace {

/// Two shares this close are one level (rounding in the subtractions must not split a tie).
constexpr double tie = 1e-9;
/// A resource's weight of unfixed transfers below this is rounding left by the subtractions.
constexpr double no_weight = 1e-9;

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
  for (auto* v : {&capacity_left_, &unfixed_weight_, &load_}) v->push_back(0);
  for (auto* v : {&first_, &count_}) v->push_back(0);
  return static_cast<resource_id>(resources_.size() - 1);
}

std::uint64_t flow_network::start(transfer_spec spec, std::function<void()> done) {
  const auto id = next_id_++;
  ++started_;
  if (spec.path.size() > max_hops) throw std::invalid_argument("transfer: more hops than max_hops");
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
    fixed_.push_back(0);
  }
  live_.push_back(slot);
  auto& f = flows_[slot];
  f.id = id;
  f.remaining = static_cast<double>(spec.bytes);
  f.rate = 0;
  f.max_rate = spec.max_rate;
  f.hops = static_cast<std::uint32_t>(spec.path.size());
  std::copy(spec.path.begin(), spec.path.end(), f.path.begin());
  f.latency = spec.latency;
  f.done = std::move(done);
  for (const auto& h : f.route()) ++resources_[h.id].active;
  schedule_recompute();
  return id;
}

double flow_network::rate_of(std::uint64_t transfer) {
  if (recompute_pending_) recompute();
  for (const auto i : live_)
    if (flows_[i].id == transfer) return flows_[i].rate;
  return 0;
}

void flow_network::settle() {
  advance();
}

void flow_network::advance() {
  const auto now = clock_.now();
  const double dt = seconds(now - last_);
  if (dt <= 0) return;
  for (const auto i : live_) flows_[i].remaining -= flows_[i].rate * dt;
  for (const auto r : touched_) {
    resources_[r].carried_bytes += load_[r] * dt;
    if (resources_[r].active > 0) resources_[r].busy += now - last_;
  }
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
/// a resource (or a transfer's own cap) saturates, fix the transfers it limits, repeat. A round
/// scans the resources and touches only the transfers it fixes, so a recomputation costs
/// rounds x resources + transfers x hops, for the tens of thousands of transfers a cluster runs.
void flow_network::recompute() {
  recompute_pending_ = false;
  ++recomputations_;
  advance();
  for (const auto r : touched_) load_[r] = 0, count_[r] = 0;
  touched_.clear();
  std::vector<std::uint32_t> capped;  // transfers with a cap of their own
  std::uint32_t unfixed = 0;
  for (const auto i : live_) {
    auto& f = flows_[i];
    f.rate = 0;
    fixed_[i] = 0;
    ++unfixed;
    if (std::isfinite(f.max_rate)) capped.push_back(i);
    for (const auto& h : f.route()) {
      if (count_[h.id]++ == 0) touched_.push_back(h.id);
      unfixed_weight_[h.id] += h.weight;
    }
  }
  // Each resource's transfers, grouped.
  std::uint32_t next = 0;
  for (const auto r : touched_) {
    first_[r] = next;
    next += count_[r];
    count_[r] = 0;
    capacity_left_[r] = resources_[r].bytes_per_second;
  }
  members_.resize(next);
  for (const auto i : live_)
    for (const auto& h : flows_[i].route()) members_[first_[h.id] + count_[h.id]++] = i;
  std::sort(capped.begin(), capped.end(), [&](auto a, auto b) {
    return flows_[a].max_rate != flows_[b].max_rate ? flows_[a].max_rate < flows_[b].max_rate : a < b;
  });

  auto next_capped = capped.begin();
  std::vector<std::uint32_t> fixing;
  while (unfixed > 0) {
    double level = std::numeric_limits<double>::infinity();
    for (const auto r : touched_)
      if (unfixed_weight_[r] > no_weight) level = std::min(level, capacity_left_[r] / unfixed_weight_[r]);
    while (next_capped != capped.end() && fixed_[*next_capped]) ++next_capped;
    if (next_capped != capped.end()) level = std::min(level, flows_[*next_capped].max_rate);
    if (std::isinf(level)) break;
    // Decide on this round's transfers before any of their shares is subtracted.
    const double limit = level * (1 + tie);
    fixing.clear();
    for (const auto r : touched_)
      if (unfixed_weight_[r] > no_weight && capacity_left_[r] / unfixed_weight_[r] <= limit)
        for (std::uint32_t k = first_[r]; k < first_[r] + count_[r]; ++k)
          if (!fixed_[members_[k]]) fixed_[members_[k]] = 1, fixing.push_back(members_[k]);
    for (; next_capped != capped.end() && flows_[*next_capped].max_rate <= limit; ++next_capped)
      if (!fixed_[*next_capped]) fixed_[*next_capped] = 1, fixing.push_back(*next_capped);
    for (const auto i : fixing) {
      auto& f = flows_[i];
      f.rate = std::min(level, f.max_rate);
      for (const auto& h : f.route()) {
        capacity_left_[h.id] = std::max(0.0, capacity_left_[h.id] - h.weight * f.rate);
        unfixed_weight_[h.id] -= h.weight;
        load_[h.id] += h.weight * f.rate;
      }
    }
    unfixed -= static_cast<std::uint32_t>(fixing.size());
  }
  for (const auto r : touched_) unfixed_weight_[r] = 0;

  // One timer, at the next completion.
  double soonest = std::numeric_limits<double>::infinity();
  for (const auto i : live_)
    if (flows_[i].rate > 0) soonest = std::min(soonest, std::max(0.0, flows_[i].remaining) / flows_[i].rate);
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
  // Keeps the live transfers in the order they started.
  std::erase_if(live_, [&](std::uint32_t i) {
    auto& f = flows_[i];
    // Within a nanosecond's worth of bytes (the clock's grain) counts as arrived.
    if (f.rate == 0 || f.remaining > f.rate * 1e-9 + 1e-6) return false;
    for (const auto& h : f.route()) --resources_[h.id].active;
    auto done = std::move(f.done);
    if (f.latency > clock::duration::zero()) {
      clock_.async_wait(f.latency, [done = std::move(done)](std::error_code) { done(); });
    } else {
      finished.push_back(std::move(done));
    }
    f = flow{};
    free_.push_back(i);
    return true;
  });
  schedule_recompute();
  for (auto& done : finished) done();
}

}  // namespace ferry::sim
