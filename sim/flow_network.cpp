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
/// How much later than the soonest completion a transfer may be due and still arrive when the
/// timer fires: the timer's rounding up to the nanosecond and `on_timer`'s tolerance (1 ns of bytes
/// and 1e-6 bytes), each with a margin.
constexpr double arrival_slack_seconds = 3e-9;
constexpr double arrival_slack_bytes = 2e-6;
/// A round's transfers come in the order of the resources' lists, scattered over `flows_`; at 384
/// GPUs (1,269 in flight) the first read of each missed the cache. Asking for the one this many
/// ahead took the flow network from 34% to 27-30% of `perf` samples there
/// (bench/results/sim_scale.md).
constexpr std::size_t prefetch_ahead = 8;

double seconds(clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

flow_network::flow_network(event_loop& loop, class clock& clock)
    : loop_(loop), clock_(clock), last_(clock.now()), rates_since_(last_) {}

flow_network::~flow_network() {
  *alive_ = false;
  if (timer_armed_) clock_.cancel(timer_);
}

resource_id flow_network::add_resource(std::string name, double bytes_per_second) {
  if (!(bytes_per_second > 0) || !std::isfinite(bytes_per_second))
    throw std::invalid_argument("resource " + name + ": its rate must be positive and finite");
  resources_.push_back({.name = std::move(name), .bytes_per_second = bytes_per_second});
  for (auto* v : {&capacity_left_, &unfixed_weight_, &load_, &weight_on_}) v->push_back(0);
  on_.emplace_back();
  busy_place_.push_back(0);
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
    fixed_in_.push_back(0);
  }
  auto& f = flows_[slot];
  f.live_place = static_cast<std::uint32_t>(live_.size());
  live_.push_back(slot);
  f.id = id;
  f.remaining = static_cast<double>(spec.bytes);
  f.rate = 0;
  f.max_rate = spec.max_rate;
  f.path = spec.path;
  f.latency = spec.latency;
  f.done = std::move(done);
  if (std::isfinite(f.max_rate)) capped_.insert(std::upper_bound(capped_.begin(), capped_.end(), slot, by_cap()), slot);
  attach(slot);
  schedule_recompute();
  return id;
}

void flow_network::attach(std::uint32_t slot) {
  auto& f = flows_[slot];
  for (std::size_t k = 0; k < f.path.size(); ++k) {
    const auto r = f.path[k].id;
    f.place[k] = static_cast<std::uint32_t>(on_[r].size());
    on_[r].push_back(slot);
    weight_on_[r] += f.path[k].weight;
    if (on_[r].size() == 1) {
      busy_place_[r] = static_cast<std::uint32_t>(busy_.size());
      busy_.push_back(r);
    }
  }
}

void flow_network::detach(std::uint32_t slot) {
  const auto& f = flows_[slot];
  for (std::size_t k = 0; k < f.path.size(); ++k) {
    const auto r = f.path[k].id;
    auto& flows = on_[r];
    const auto moved = flows.back();
    const auto last = static_cast<std::uint32_t>(flows.size() - 1);
    flows[f.place[k]] = moved;
    flows.pop_back();
    // The flow that took this place: find its hop of r that sat last.
    auto& m = flows_[moved];
    for (std::size_t j = 0; j < m.path.size(); ++j)
      if (m.path[j].id == r && m.place[j] == last) {
        m.place[j] = f.place[k];
        break;
      }
    weight_on_[r] -= f.path[k].weight;
    if (flows.empty()) {
      weight_on_[r] = 0;  // no rounding left behind
      load_[r] = 0;
      busy_place_[busy_.back()] = busy_place_[r];
      busy_[busy_place_[r]] = busy_.back();
      busy_.pop_back();
    }
  }
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
  for (const auto r : busy_) {
    resources_[r].carried_bytes += load_[r] * dt;
    resources_[r].busy += now - last_;
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
/// scans once the resources that still carry unfixed transfers and touches only the transfers it
/// fixes; each resource's flows and the capped transfers are kept as they start and end, and a
/// transfer counts as fixed when stamped with this recomputation's number. So a recomputation
/// costs rounds x resources + transfers x hops, for the tens of thousands of transfers a cluster
/// runs. Each transfer's bytes left are brought up to now as its new rate is set: between
/// recomputations nothing walks the transfers in flight. Shares are compared by cross-multiplying:
/// a division each would cost more than all the rest of a round.
void flow_network::recompute() {
  recompute_pending_ = false;
  const auto stamp = ++recomputations_;
  advance();
  const double elapsed = seconds(clock_.now() - rates_since_);
  rates_since_ = clock_.now();
  finishing_.clear();
  unfilled_.clear();
  for (const auto r : busy_) {
    load_[r] = 0;
    capacity_left_[r] = resources_[r].bytes_per_second;
    unfixed_weight_[r] = weight_on_[r];
    unfilled_.push_back(r);
  }

  // The next completion, found as rates are fixed: the least remaining / rate, compared without
  // dividing; of equals, the transfer that started first.
  double soonest_bytes = std::numeric_limits<double>::infinity(), soonest_rate = 1;
  std::uint64_t soonest_id = 0;
  auto next_capped = capped_.begin();
  auto unfixed = live_.size();
  while (unfixed > 0) {
    // One pass over the resources some unfixed transfer crosses: those left with none drop out;
    // the least capacity left per unfixed weight (c / w < best_c / best_w) is found, and every
    // resource that may turn out to share it is kept, in the order of `busy_`.
    double best_c = std::numeric_limits<double>::infinity(), best_w = 1;
    saturating_.clear();
    std::size_t kept = 0;
    for (const auto r : unfilled_) {
      const double w = unfixed_weight_[r];
      if (!(w > no_weight)) continue;
      unfilled_[kept++] = r;
      const double c = capacity_left_[r];
      if (c * best_w < best_c * w) best_c = c, best_w = w;
      if (c * best_w <= best_c * w * (1 + 2 * tie)) saturating_.push_back(r);  // looser than below
    }
    unfilled_.resize(kept);
    double level = best_c / best_w;
    while (next_capped != capped_.end() && fixed_in_[*next_capped] == stamp) ++next_capped;
    if (next_capped != capped_.end()) level = std::min(level, flows_[*next_capped].max_rate);
    if (std::isinf(level)) break;
    // Decide on this round's transfers before any of their shares is subtracted.
    const double limit = level * (1 + tie);
    fixing_.clear();
    for (const auto r : saturating_) {
      if (capacity_left_[r] <= limit * unfixed_weight_[r])
        for (const auto i : on_[r])
          if (fixed_in_[i] != stamp) fixed_in_[i] = stamp, fixing_.push_back(i);
    }
    for (; next_capped != capped_.end() && flows_[*next_capped].max_rate <= limit; ++next_capped)
      if (fixed_in_[*next_capped] != stamp) fixed_in_[*next_capped] = stamp, fixing_.push_back(*next_capped);
    for (std::size_t k = 0; k < fixing_.size(); ++k) {
      if (k + prefetch_ahead < fixing_.size()) {
        // Its rates and its first hops: the first two cache lines.
        const auto* ahead = reinterpret_cast<const char*>(&flows_[fixing_[k + prefetch_ahead]]);
        __builtin_prefetch(ahead);
        __builtin_prefetch(ahead + 64);
      }
      const auto i = fixing_[k];
      auto& f = flows_[i];
      f.remaining -= f.rate * elapsed;
      f.rate = std::min(level, f.max_rate);
      for (const auto& h : f.path) {
        capacity_left_[h.id] = std::max(0.0, capacity_left_[h.id] - h.weight * f.rate);
        unfixed_weight_[h.id] -= h.weight;
        load_[h.id] += h.weight * f.rate;
      }
      const double left = std::max(0.0, f.remaining);
      if (f.rate > 0) {
        const double mine = left * soonest_rate, best = soonest_bytes * f.rate;
        if (mine < best || (mine == best && f.id < soonest_id))
          soonest_bytes = left, soonest_rate = f.rate, soonest_id = f.id;
        // May arrive when the timer fires: due within the timer's rounding up to the nanosecond and
        // `on_timer`'s tolerance of the soonest so far, which only comes sooner.
        if (left * soonest_rate <= (soonest_bytes + arrival_slack_seconds * soonest_rate) * f.rate +
                                       arrival_slack_bytes * soonest_rate)
          finishing_.push_back(i);
      }
    }
    unfixed -= fixing_.size();
  }
  if (unfixed > 0)  // transfers no resource and no cap limits: none can, but they would not move
    for (const auto i : live_)
      if (auto& f = flows_[i]; fixed_in_[i] != stamp) f.remaining -= f.rate * elapsed, f.rate = 0;

  if (timer_armed_) {
    clock_.cancel(timer_);
    timer_armed_ = false;
  }
  if (std::isinf(soonest_bytes)) return;
  const double soonest = soonest_bytes / soonest_rate;
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
  const double elapsed = seconds(clock_.now() - rates_since_);
  // Within a nanosecond's worth of bytes (the clock's grain) counts as arrived.
  std::erase_if(finishing_, [&](std::uint32_t i) {
    const auto& f = flows_[i];
    return f.rate == 0 || f.remaining - f.rate * elapsed > f.rate * 1e-9 + 1e-6;
  });
  // Completions in the order the transfers started, as their latencies' timers and their callbacks
  // are ordered by.
  std::ranges::sort(finishing_, {}, [this](std::uint32_t i) { return flows_[i].id; });
  std::vector<std::function<void()>> finished;
  for (const auto i : finishing_) {
    auto& f = flows_[i];
    detach(i);
    if (std::isfinite(f.max_rate)) capped_.erase(std::lower_bound(capped_.begin(), capped_.end(), i, by_cap()));
    flows_[live_.back()].live_place = f.live_place;
    live_[f.live_place] = live_.back();
    live_.pop_back();
    auto done = std::move(f.done);
    if (f.latency > clock::duration::zero()) {
      clock_.async_wait(f.latency, [done = std::move(done)](std::error_code) { done(); });
    } else {
      finished.push_back(std::move(done));
    }
    f = flow{};
    free_.push_back(i);
  }
  finishing_.clear();
  schedule_recompute();
  for (auto& done : finished) done();
}

}  // namespace ferry::sim
