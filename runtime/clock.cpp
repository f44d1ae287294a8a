#include "runtime/clock.hpp"

#include <algorithm>
#include <boost/asio/error.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <stdexcept>

#include "runtime/await.hpp"

namespace ferry {

void clock::sleep_for(duration d) {
  await<std::error_code>([&](auto done) { async_wait(d, std::move(done)); });
}

struct real_clock::timer_state {
  explicit timer_state(boost::asio::io_context& io) : timer(io) {}
  boost::asio::steady_timer timer;
};

clock::time_point real_clock::now() const {
  return std::chrono::time_point_cast<duration>(std::chrono::steady_clock::now());
}

std::uint64_t real_clock::async_wait_until(time_point when, handler h) {
  const auto id = next_id_++;
  auto state = std::make_shared<timer_state>(io_);
  state->timer.expires_at(when);
  timers_.emplace(id, state);
  state->timer.async_wait([this, id, state, h = std::move(h)](std::error_code ec) {
    timers_.erase(id);
    h(ec);
  });
  return id;
}

void real_clock::cancel(std::uint64_t timer) {
  if (auto it = timers_.find(timer); it != timers_.end()) it->second->timer.cancel();
}

void virtual_clock::timer_queue::push(const entry& e, duration delay) {
  auto* in = std::ranges::find(lanes_, delay, &lane::delay);
  if (in == lanes_.end() && delay == heap_delay_) {
    in = std::ranges::find_if(lanes_, &lane::empty);
    if (in != lanes_.end()) in->delay = delay;
  }
  const bool soonest = empty() || earlier(e, top());
  ++size_;
  if (in == lanes_.end()) {
    heap_delay_ = delay;
    heap_.push_back(e);
    std::push_heap(heap_.begin(), heap_.end(), later{});
    if (soonest) soonest_ = lane_count;
    return;
  }
  in->entries.push_back(e);
  if (soonest) soonest_ = static_cast<std::size_t>(in - lanes_.begin());
}

void virtual_clock::timer_queue::lane::pop() {
  if (++head == entries.size()) {
    entries.clear();
    head = 0;
  } else if (head >= 256 && 2 * head >= entries.size()) {
    // The entries gone from its front, dropped: O(1) per pop, as each is moved at most once.
    entries.erase(entries.begin(), entries.begin() + static_cast<std::ptrdiff_t>(head));
    head = 0;
  }
}

void virtual_clock::timer_queue::pop() {
  if (soonest_ == lane_count) {
    std::pop_heap(heap_.begin(), heap_.end(), later{});
    heap_.pop_back();
  } else {
    lanes_[soonest_].pop();
  }
  --size_;
  find_soonest();
}

void virtual_clock::timer_queue::find_soonest() {
  const entry* best = heap_.empty() ? nullptr : &heap_.front();
  soonest_ = lane_count;
  for (std::size_t l = 0; l < lane_count; ++l)
    if (!lanes_[l].empty() && (!best || earlier(lanes_[l].front(), *best)))
      best = &lanes_[l].front(), soonest_ = l;
}

void virtual_clock::timer_queue::erase_if(const std::function<bool(const entry&)>& gone) {
  std::erase_if(heap_, gone);
  std::make_heap(heap_.begin(), heap_.end(), later{});
  size_ = heap_.size();
  for (auto& l : lanes_) {
    l.entries.erase(l.entries.begin(), l.entries.begin() + static_cast<std::ptrdiff_t>(l.head));
    l.head = 0;
    std::erase_if(l.entries, gone);
    size_ += l.entries.size();
  }
  find_soonest();
}

std::uint64_t virtual_clock::async_wait_until(time_point when, handler h) {
  std::uint32_t s;
  if (!free_.empty()) {
    s = free_.back();
    free_.pop_back();
  } else {
    if (slots_.size() > slot_mask)
      throw std::length_error("virtual_clock: too many timers pending");
    s = static_cast<std::uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  const auto id = next_order_++ << slot_bits | s;
  slots_[s] = {.id = id, .h = std::move(h)};
  when = std::max(when, now_);
  queue_.push({when, id}, when - now_);
  return id;
}

clock::handler virtual_clock::release(std::uint64_t id) {
  auto& s = slots_[id & slot_mask];
  auto h = std::move(s.h);
  s = {};
  free_.push_back(static_cast<std::uint32_t>(id & slot_mask));
  return h;
}

void virtual_clock::cancel(std::uint64_t timer) {
  const auto s = timer & slot_mask;
  if (timer == 0 || s >= slots_.size() || slots_[s].id != timer) return;
  boost::asio::post(io_, [h = release(timer)] {
    h(std::error_code(boost::asio::error::make_error_code(boost::asio::error::operation_aborted)));
  });
  // Cancelled entries wait in the queue for their time; a queue mostly of them is rebuilt.
  if (queue_.size() > 64 && queue_.size() > 4 * pending())
    queue_.erase_if([this](const entry& e) { return cancelled(e); });
}

void virtual_clock::advance_to(time_point t) {
  while (!queue_.empty() && queue_.top().when <= t) {
    const auto e = queue_.top();
    queue_.pop();
    if (cancelled(e)) continue;
    now_ = e.when;
    boost::asio::post(io_, [h = release(e.id)] { h({}); });
  }
  if (t > now_) now_ = t;
}

bool virtual_clock::advance_to_next() {
  while (!queue_.empty() && cancelled(queue_.top())) queue_.pop();
  if (queue_.empty()) return false;
  now_ = queue_.top().when;
  // All of the instant's handlers are taken before any runs, as posting them would: one that a
  // handler cancels or sets for now still fires, or waits for the next call.
  auto firing = std::move(firing_);
  while (!queue_.empty() && queue_.top().when <= now_) {
    const auto e = queue_.top();
    queue_.pop();
    if (!cancelled(e)) firing.push_back(release(e.id));
  }
  for (auto& h : firing) h({});
  firing.clear();
  firing_ = std::move(firing);
  return true;
}

}  // namespace ferry
