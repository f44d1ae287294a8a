#include "sim/flow_network.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>

#include "runtime/event_loop.hpp"

namespace ferry::sim {
namespace {

/// Two shares this close are one level (rounding in the subtractions must not split a tie).
constexpr double tie = 1e-9;
/// A resource's weight of unfixed transfers below this is rounding left by the subtractions.
constexpr double no_weight = 1e-9;
/// A rate that a re-solve moves by less than this, relatively, is rounding and is kept.
constexpr double same_rate = 1e-12;
/// None of a resource's region flows is bottlenecked there.
constexpr double not_saturated = -1;
/// A round's transfers come in the order of the resources' lists, scattered over `flows_`, and the
/// first read of each misses the cache. When every transfer was solved each time, asking for the
/// one this many ahead took the flow network from 34% to 27-30% of `perf` samples at 384 GPUs
/// (bench/results/sim_scale.md).
constexpr std::size_t prefetch_ahead = 8;

}  // namespace

flow_network::flow_network(event_loop& loop, class clock& clock) : loop_(loop), clock_(clock) {}

flow_network::~flow_network() {
  *alive_ = false;
  if (timer_armed_) clock_.cancel(timer_);
  for (const auto& e : endings_)
    if (e.waiting != 0) clock_.cancel(e.waiting);
}

double flow_network::now_ns() const {
  return static_cast<double>(clock_.now().time_since_epoch().count());
}

resource_id flow_network::add_resource(std::string name, double bytes_per_second) {
  if (!(bytes_per_second > 0) || !std::isfinite(bytes_per_second))
    throw std::invalid_argument("resource " + name + ": its rate must be positive and finite");
  resources_.push_back({.name = std::move(name), .bytes_per_second = bytes_per_second});
  on_.emplace_back();
  state_.push_back({.capacity = bytes_per_second, .accounted = now_ns()});
  return static_cast<resource_id>(resources_.size() - 1);
}

std::uint64_t flow_network::start(transfer_spec spec, std::function<void()> done) {
  const auto id = next_id_++;
  ++started_;
  for (const auto& h : spec.path)
    if (h.id >= resources_.size() || !(h.weight > 0))
      throw std::invalid_argument("transfer: a hop names no resource or has no weight");
  const auto slot = take_slot(id, spec.latency, std::move(done));
  if (spec.bytes == 0 || (spec.path.empty() && std::isinf(spec.max_rate))) {
    wait_latency(slot);
    return id;
  }
  if (spec.path.empty()) {
    // A copy inside one device, at its own cap: a timer where the solver would give the same rate.
    // Its last byte arrives when a flow's would, and its latency runs from there.
    const double arrives = now_ns() + static_cast<double>(spec.bytes) / spec.max_rate * 1e9;
    const clock::time_point at(clock::duration(static_cast<std::int64_t>(std::ceil(arrives))));
    endings_[slot].waiting =
        clock_.async_wait_until(at + spec.latency, [this, slot](std::error_code ec) {
          if (!ec) finish(slot);
        });
    return id;
  }
  auto& f = flows_[slot];
  f.rate = 0;
  f.remaining = static_cast<double>(spec.bytes);
  f.since = now_ns();
  f.max_rate = spec.max_rate;
  f.bottleneck = unsolved;
  f.live_place = static_cast<std::uint32_t>(live_.size());
  live_.push_back(slot);
  due_at_.push_back(std::numeric_limits<double>::infinity());
  if (f.live_place % due_block == 0)
    due_soonest_.push_back(std::numeric_limits<double>::infinity());
  f.hop_count = static_cast<std::uint32_t>(spec.path.size());
  std::ranges::copy(spec.path, f.path.begin());
  attach(slot);
  started_now_.push_back(slot);
  schedule_recompute();
  return id;
}

std::uint32_t flow_network::take_slot(std::uint64_t id, clock::duration latency,
                                      std::function<void()> done) {
  auto slot = free_.take();
  if (slot == nowhere) {
    slot = static_cast<std::uint32_t>(flows_.size());
    flows_.emplace_back();
    endings_.emplace_back();
    solving_.emplace_back();
  }
  flows_[slot].id = id;
  endings_[slot].latency = latency;
  endings_[slot].done = std::move(done);
  return slot;
}

void flow_network::wait_latency(std::uint32_t slot) {
  endings_[slot].waiting =
      clock_.async_wait(endings_[slot].latency, [this, slot](std::error_code ec) {
        if (!ec) finish(slot);
      });
}

void flow_network::finish(std::uint32_t slot) {
  auto done = std::move(endings_[slot].done);
  free_slot(slot);
  done();
}

void flow_network::free_slot(std::uint32_t slot) {
  // Only what marks the slot free: `start` sets the rest again. Resetting the whole slot (then
  // over 250 bytes) was 2% of the instructions per version at 32 GPUs.
  flows_[slot].id = 0;
  endings_[slot].waiting = 0;
  endings_[slot].done = nullptr;
  free_.add(slot);
}

void flow_network::free_slots::add(std::uint32_t slot) {
  const auto word = slot / 64;
  if (word >= words_.size()) words_.resize(word + 1), any_.resize(word / 64 + 1);
  words_[word] |= std::uint64_t{1} << (slot % 64);
  any_[word / 64] |= std::uint64_t{1} << (word % 64);
}

std::uint32_t flow_network::free_slots::take() {
  for (std::size_t a = 0; a < any_.size(); ++a) {
    if (any_[a] == 0) continue;
    const auto word = a * 64 + std::countr_zero(any_[a]);
    const auto bit = std::countr_zero(words_[word]);
    words_[word] &= words_[word] - 1;
    if (words_[word] == 0) any_[a] &= any_[a] - 1;
    return static_cast<std::uint32_t>(word * 64 + bit);
  }
  return nowhere;
}

void flow_network::account(resource_id r, double now) {
  auto& state = state_[r];
  const double dt = now - state.accounted;
  state.accounted = now;
  if (!(dt > 0)) return;
  state.carried_bytes += state.load * dt * 1e-9;
  state.busy += clock::duration(static_cast<std::int64_t>(dt));
}

void flow_network::attach(std::uint32_t slot) {
  auto& f = flows_[slot];
  const double now = f.since;
  for (std::size_t k = 0; k < f.hop_count; ++k) {
    const auto r = f.path[k].id;
    if (on_[r].empty()) state_[r].accounted = now;  // its idle time ends
    f.place[k] = static_cast<std::uint32_t>(on_[r].size());
    on_[r].push_back({slot, static_cast<std::uint32_t>(k)});
  }
}

void flow_network::detach(std::uint32_t slot) {
  auto& f = flows_[slot];
  const double now = now_ns();
  for (std::size_t k = 0; k < f.hop_count; ++k) {
    const auto r = f.path[k].id;
    account(r, now);
    state_[r].load -= f.path[k].weight * f.rate;
    if (f.bottleneck == static_cast<std::int32_t>(r)) state_[r].own_weight -= f.path[k].weight;
    auto& flows = on_[r];
    const auto moved = flows.back();
    flows[f.place[k]] = moved;
    flows.pop_back();
    // The hop that took this place (maybe another of this flow's, on a path that crosses r again).
    flows_[moved.slot].place[moved.hop] = f.place[k];
    f.place[k] = nowhere;
    if (flows.empty()) {
      state_[r].load = 0;  // no rounding left behind
      state_[r].own_weight = 0;
      state_[r].fastest = 0;
    } else if (state_[r].own_weight > no_weight) {
      freed_.push_back(r);  // the transfers bottlenecked here may rise
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
  const double now = now_ns();
  for (resource_id r = 0; r < resources_.size(); ++r)
    if (on_[r].empty())
      state_[r].accounted = now;
    else
      account(r, now);
}

void flow_network::schedule_recompute() {
  if (recompute_pending_) return;
  recompute_pending_ = true;
  // Later in this same instant: every transfer started or ended now is counted once, together.
  loop_.post([this, alive = alive_] {
    if (*alive && recompute_pending_) recompute();
  });
}

/// Max-min fair shares, re-solved only where they can move. The last solution is kept: each
/// transfer's rate and bottleneck (the saturated resource where no transfer has a higher rate, or
/// its own cap), and each resource's level (its bottlenecked transfers' rate) and load. The region
/// re-solved starts as the transfers that started, those bottlenecked where one ended, and those
/// bottlenecked where any of these cross; the rest are held at their rates. If the region's new
/// rates would leave a held transfer without its bottleneck (its resource no longer saturated, or
/// passed by a region transfer) or give a region transfer a bottleneck where a held one moves
/// faster, those held transfers join the region and it is solved again. The fair allocation is
/// unique, so what comes out is the one a solve of every transfer gives, to rounding; at 384 GPUs
/// nine in ten transfers keep their rate from one recomputation to the next
/// (bench/results/sim_scale.md).
void flow_network::recompute() {
  recompute_pending_ = false;
  ++recomputations_;
  ++stamp_;
  region_.clear();
  for (const auto slot : started_now_) add_to_region(slot);
  for (const auto r : freed_) add_group(r);
  // Where these cross a resource others are bottlenecked at, their new rates move the others' (a
  // transfer started there takes its share, one that rises takes more): those join now, not after
  // a filling finds them. Selective delivery at 64 GPUs went from 1.9 fillings per recomputation
  // to 1.1.
  for (std::size_t k = 0, n = region_.size(); k < n; ++k)
    for (const auto& h : flows_[region_[k]].hops())
      if (state_[h.id].own_weight > no_weight) add_group(h.id);
  started_now_.clear();
  freed_.clear();
  if (!region_.empty()) {
    do {
      if (2 * region_.size() > live_.size())  // most of it: solving it all is cheaper than checking
        for (const auto i : live_) add_to_region(i);
      fill_region();
    } while (grow_region());
    commit_region(now_ns());
  }
  arm_timer();
}

void flow_network::add_to_region(std::uint32_t slot) {
  if (solving_[slot].in_region == stamp_) return;
  solving_[slot].in_region = stamp_;
  region_.push_back(slot);
}

void flow_network::add_group(resource_id r) {
  if (state_[r].grouped_in == stamp_) return;
  state_[r].grouped_in = stamp_;
  for (const auto [i, hop] : on_[r])
    if (flows_[i].bottleneck == static_cast<std::int32_t>(r)) add_to_region(i);
}

/// Progressive filling of the region: raise every unfixed region transfer's rate together until a
/// resource (or a transfer's own cap) saturates, fix the transfers it limits, repeat. A resource's
/// capacity is what the held transfers leave. A round scans once the resources that still carry
/// unfixed transfers and touches only the transfers it fixes. Shares are compared by
/// cross-multiplying: a division each would cost more than all the rest of a round.
void flow_network::fill_region() {
  ++fill_;
  reached_.clear();
  capped_.clear();
  for (std::size_t k = 0; k < region_.size(); ++k) {
    if (k + prefetch_ahead < region_.size())
      __builtin_prefetch(&flows_[region_[k + prefetch_ahead]]);
    const auto i = region_[k];
    const auto& f = flows_[i];
    if (std::isfinite(f.max_rate)) capped_.push_back(i);
    for (const auto& h : f.hops()) {
      const auto r = h.id;
      if (state_[r].reached_in != fill_) {
        state_[r].reached_in = fill_;
        reached_.push_back(r);
        state_[r].capacity_left = state_[r].capacity - state_[r].load;
        state_[r].unfixed_weight = state_[r].region_own = 0;
        state_[r].region_count = 0;
        state_[r].saturated_at = not_saturated;
      }
      state_[r].capacity_left += h.weight * f.rate;  // the region's own share is free again
      state_[r].unfixed_weight += h.weight;
      if (f.bottleneck == static_cast<std::int32_t>(r)) state_[r].region_own += h.weight;
      ++state_[r].region_count;
    }
  }
  // Each reached resource's region transfers, side by side in `region_on_`.
  std::uint32_t begin = 0;
  for (const auto r : reached_) {
    state_[r].capacity_left = std::max(0.0, state_[r].capacity_left);
    state_[r].region_begin = begin;
    begin += state_[r].region_count;
    state_[r].region_count = 0;
  }
  region_on_.resize(begin);
  for (const auto i : region_)
    for (const auto& h : flows_[i].hops())
      region_on_[state_[h.id].region_begin + state_[h.id].region_count++] = i;
  std::ranges::sort(capped_, [this](std::uint32_t a, std::uint32_t b) {
    return flows_[a].max_rate != flows_[b].max_rate ? flows_[a].max_rate < flows_[b].max_rate
                                                    : a < b;
  });

  unfilled_.assign(reached_.begin(), reached_.end());
  auto next_capped = capped_.begin();
  auto unfixed = region_.size();
  while (unfixed > 0) {
    // One pass over the resources some unfixed transfer crosses: those left with none drop out;
    // the least capacity left per unfixed weight (c / w < best_c / best_w) is found, and every
    // resource that may turn out to share it is kept.
    double best_c = std::numeric_limits<double>::infinity(), best_w = 1;
    saturating_.clear();
    std::size_t kept = 0;
    for (const auto r : unfilled_) {
      const double w = state_[r].unfixed_weight;
      if (!(w > no_weight)) continue;
      unfilled_[kept++] = r;
      const double c = state_[r].capacity_left;
      if (c * best_w < best_c * w) best_c = c, best_w = w;
      if (c * best_w <= best_c * w * (1 + 2 * tie)) saturating_.push_back(r);  // looser than below
    }
    unfilled_.resize(kept);
    double level = best_c / best_w;
    while (next_capped != capped_.end() && solving_[*next_capped].fixed_in == fill_) ++next_capped;
    if (next_capped != capped_.end()) level = std::min(level, flows_[*next_capped].max_rate);
    if (std::isinf(level)) break;
    // Decide on this round's transfers before any of their shares is subtracted.
    const double limit = level * (1 + tie);
    fixing_.clear();
    for (const auto r : saturating_) {
      if (state_[r].capacity_left > limit * state_[r].unfixed_weight) continue;
      const auto fixed_before = fixing_.size();
      for (auto k = state_[r].region_begin, end = k + state_[r].region_count; k < end; ++k) {
        const auto i = region_on_[k];
        if (solving_[i].fixed_in == fill_) continue;
        solving_[i].fixed_in = fill_;
        solving_[i].new_bottleneck = static_cast<std::int32_t>(r);
        fixing_.push_back(i);
      }
      if (fixing_.size() > fixed_before) state_[r].saturated_at = level;
    }
    for (; next_capped != capped_.end() && flows_[*next_capped].max_rate <= limit; ++next_capped)
      if (const auto i = *next_capped; solving_[i].fixed_in != fill_)
        solving_[i].fixed_in = fill_, solving_[i].new_bottleneck = own_cap, fixing_.push_back(i);
    for (std::size_t k = 0; k < fixing_.size(); ++k) {
      if (k + prefetch_ahead < fixing_.size()) {
        // Its cap and hops: the first cache line, and the next for a path of over five hops.
        const auto* ahead = reinterpret_cast<const char*>(&flows_[fixing_[k + prefetch_ahead]]);
        __builtin_prefetch(ahead);
        __builtin_prefetch(ahead + 64);
      }
      const auto i = fixing_[k];
      const auto& f = flows_[i];
      const double rate = solving_[i].new_rate = std::min(level, f.max_rate);
      for (const auto& h : f.hops()) {
        state_[h.id].capacity_left = std::max(0.0, state_[h.id].capacity_left - h.weight * rate);
        state_[h.id].unfixed_weight -= h.weight;
      }
    }
    unfixed -= fixing_.size();
  }
  if (unfixed > 0)  // transfers no resource and no cap limits: none can, but they would not move
    for (const auto i : region_)
      if (solving_[i].fixed_in != fill_)
        solving_[i].new_rate = 0, solving_[i].new_bottleneck = unsolved;
}

bool flow_network::grow_region() {
  if (region_.size() == live_.size()) return false;
  const auto before = region_.size();
  for (const auto r : reached_) {
    // Held transfers bottlenecked here keep their rate only if the resource stays saturated and no
    // region transfer passes them on it.
    const double held = state_[r].own_weight - state_[r].region_own;
    if (held > no_weight) {
      bool kept = state_[r].capacity_left <= tie * state_[r].level * held;
      for (auto k = state_[r].region_begin, end = k + state_[r].region_count; kept && k < end; ++k)
        kept = solving_[region_on_[k]].new_rate <= state_[r].level * (1 + tie);
      if (!kept) add_group(r);
    }
    // Region transfers bottlenecked here need every held one on it to be no faster.
    const double level = state_[r].saturated_at;
    if (level == not_saturated || state_[r].fastest <= level * (1 + tie)) continue;
    // The held transfers that must slow down are those above the level this resource alone would
    // give, the others kept at their rates (the filling's level, all held, is lower): if none were
    // above it, it would be the filling's.
    const double fair = fair_level(r, level);
    for (const auto& s : shares_) {
      if (s.slot == nowhere || s.rate <= fair * (1 + tie)) continue;
      if (const auto b = flows_[s.slot].bottleneck; b >= 0)
        add_group(static_cast<resource_id>(b));
      else
        add_to_region(s.slot);
    }
  }
  return region_.size() > before;
}

/// Max-min on resource `r` alone: its region transfers bottlenecked here rise together from
/// `level`, every other transfer on it at most to the rate it has (held) or was just given
/// (region). Each pass lets those below the last estimate keep their rate and shares the rest;
/// the estimate only rises, and a few passes settle it. Leaves the others in `shares_` and makes
/// `state_[r].fastest` exact.
double flow_network::fair_level(resource_id r, double level) {
  shares_.clear();
  double rising = 0, fastest = 0;
  // One entry per hop: a path that crosses r twice has two, each with its own weight.
  for (const auto [i, hop] : on_[r]) {
    const auto& f = flows_[i];
    const double weight = f.path[hop].weight;
    if (solving_[i].in_region != stamp_) {
      shares_.push_back({f.rate, weight, i});
      fastest = std::max(fastest, f.rate);
    } else if (solving_[i].new_bottleneck != static_cast<std::int32_t>(r)) {
      shares_.push_back({solving_[i].new_rate, weight, nowhere});
      fastest = std::max(fastest, solving_[i].new_rate);
    } else {
      rising += weight;
    }
  }
  state_[r].fastest = std::max(fastest, level);
  // None above the level (the bound was stale, half the calls): the level stands, as the passes
  // below would find.
  if (fastest <= level * (1 + tie)) return level;
  for (;;) {
    double left = state_[r].capacity, weight = rising;
    for (const auto& s : shares_) {
      if (s.rate <= level)
        left -= s.rate * s.weight;
      else
        weight += s.weight;
    }
    const double next = left / weight;
    if (!(next > level * (1 + tie))) return std::max(level, next);
    level = next;
  }
}

void flow_network::commit_region(double now) {
  for (const auto r : reached_) {
    // Where region transfers were bottlenecked, their level; held ones there stay within a tie of
    // it, and the level must bound them too.
    auto& state = state_[r];
    if (state.saturated_at == not_saturated) continue;
    const bool held = state.own_weight - state.region_own > no_weight;
    state.level = held ? std::max(state.level, state.saturated_at) : state.saturated_at;
  }
  for (const auto i : region_) {
    auto& f = flows_[i];
    const double rate = solving_[i].new_rate;
    const bool moves = std::abs(rate - f.rate) > same_rate * f.rate;
    for (const auto& h : f.hops()) {
      auto& state = state_[h.id];
      if (f.bottleneck != solving_[i].new_bottleneck) {
        if (static_cast<std::int32_t>(h.id) == f.bottleneck) state.own_weight -= h.weight;
        if (static_cast<std::int32_t>(h.id) == solving_[i].new_bottleneck)
          state.own_weight += h.weight;
      }
      // Kept or not, its rate bounds the resource's fastest again: `fair_level` left it out.
      state.fastest = std::max(state.fastest, moves ? rate : f.rate);
      if (moves) {
        account(h.id, now);
        state.load += h.weight * (rate - f.rate);
      }
    }
    f.bottleneck = solving_[i].new_bottleneck;
    if (!moves) continue;
    f.remaining = std::max(0.0, f.remaining - f.rate * (now - f.since) * 1e-9);
    f.since = now;
    f.rate = rate;
    if (rate > 0) {
      due_set(i, now + f.remaining / rate * 1e9);
    } else {
      due_erase(i);
    }
  }
}

void flow_network::due_set(std::uint32_t slot, double at) {
  const auto place = flows_[slot].live_place;
  const double was = due_at_[place];
  due_at_[place] = at;
  auto& soonest = due_soonest_[place / due_block];
  if (at <= soonest)
    soonest = at;
  else if (was == soonest)
    due_rescan(place / due_block);
}

void flow_network::due_rescan(std::size_t block) {
  const auto begin = block * due_block, end = std::min(begin + due_block, due_at_.size());
  // Four minima side by side, not one chain of compares through the block (2% of a steady
  // event's instructions at 384 GPUs when it was one); `m < x ? m : x` is one `minsd` into `m`.
  const double* due = due_at_.data();
  const auto lower = [](double m, double x) { return m < x ? m : x; };
  double a = std::numeric_limits<double>::infinity(), b = a, c = a, d = a;
  auto p = begin;
  for (; p + 4 <= end; p += 4) {
    a = lower(a, due[p]);
    b = lower(b, due[p + 1]);
    c = lower(c, due[p + 2]);
    d = lower(d, due[p + 3]);
  }
  for (; p < end; ++p) a = lower(a, due[p]);
  due_soonest_[block] = lower(lower(a, b), lower(c, d));
}

double flow_network::due_soonest() const {
  return due_soonest_.empty() ? std::numeric_limits<double>::infinity()
                              : *std::ranges::min_element(due_soonest_);
}

void flow_network::leave_live(std::uint32_t slot) {
  const auto place = flows_[slot].live_place, last = static_cast<std::uint32_t>(live_.size() - 1);
  const double left = due_at_[place], moved = due_at_[last];
  flows_[live_[last]].live_place = place;
  live_[place] = live_[last];
  live_.pop_back();
  due_at_[place] = moved;
  due_at_.pop_back();
  if (last % due_block == 0) due_soonest_.pop_back();
  // A block is scanned again only when its soonest left it.
  const auto block = place / due_block, last_block = last / due_block;
  if (block == last_block) {
    if (block < due_soonest_.size() && left == due_soonest_[block]) due_rescan(block);
    return;
  }
  if (moved <= due_soonest_[block])
    due_soonest_[block] = moved;
  else if (left == due_soonest_[block])
    due_rescan(block);
  if (last_block < due_soonest_.size() && moved == due_soonest_[last_block]) due_rescan(last_block);
}

void flow_network::arm_timer() {
  const double soonest = due_soonest();
  if (std::isinf(soonest)) {
    if (timer_armed_) clock_.cancel(timer_);
    timer_armed_ = false;
    return;
  }
  const auto at = static_cast<std::int64_t>(std::ceil(soonest));
  if (timer_armed_ && at == timer_at_) return;
  if (timer_armed_) clock_.cancel(timer_);
  timer_armed_ = true;
  timer_at_ = at;
  const auto generation = ++generation_;
  timer_ = clock_.async_wait_until(clock::time_point(clock::duration(at)),
                                   [this, generation](std::error_code ec) {
                                     // Cancelled, as the destructor does, it touches nothing.
                                     if (!ec && generation == generation_) on_timer();
                                   });
}

void flow_network::on_timer() {
  timer_armed_ = false;
  const double now = now_ns();
  // Within a nanosecond (the clock's grain) or a millionth of a byte counts as arrived; a block
  // whose soonest is over 2 ns away holds none. (A millionth of a byte is over a nanosecond only
  // under 1 KB/s: such a transfer arrives at its due time instead.) Which arrive together does
  // not depend on their order: they complete in the order they started.
  arrived_.clear();
  for (std::size_t b = 0; b < due_soonest_.size(); ++b) {
    if (due_soonest_[b] > now + 2) continue;
    for (auto p = b * due_block, end = std::min(p + due_block, due_at_.size()); p < end; ++p)
      if (due_at_[p] <= now + 2 && due_at_[p] <= now + 1 + 1e-6 / flows_[live_[p]].rate * 1e9)
        arrived_.push_back(live_[p]);
  }
  if (arrived_.empty()) {
    arm_timer();
    return;
  }
  // Completions in the order the transfers started, as their latencies' timers and their callbacks
  // are ordered by.
  std::ranges::sort(arrived_, {}, [this](std::uint32_t i) { return flows_[i].id; });
  auto finished = std::move(finished_);
  for (const auto i : arrived_) {
    detach(i);
    leave_live(i);
    if (endings_[i].latency > clock::duration::zero()) {
      wait_latency(i);  // the slot stays taken until then
      continue;
    }
    finished.push_back(std::move(endings_[i].done));
    free_slot(i);
  }
  schedule_recompute();
  for (auto& done : finished) done();
  finished.clear();
  finished_ = std::move(finished);
}

}  // namespace ferry::sim
