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
  queue_.push_back({std::max(when, now_), id});
  std::push_heap(queue_.begin(), queue_.end(), later{});
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
  if (queue_.size() > 64 && queue_.size() > 4 * pending()) {
    std::erase_if(queue_, [this](const entry& e) { return cancelled(e); });
    std::make_heap(queue_.begin(), queue_.end(), later{});
  }
}

void virtual_clock::pop() {
  std::pop_heap(queue_.begin(), queue_.end(), later{});
  queue_.pop_back();
}

void virtual_clock::advance_to(time_point t) {
  while (!queue_.empty() && queue_.front().when <= t) {
    const auto e = queue_.front();
    pop();
    if (cancelled(e)) continue;
    now_ = e.when;
    boost::asio::post(io_, [h = release(e.id)] { h({}); });
  }
  if (t > now_) now_ = t;
}

bool virtual_clock::advance_to_next() {
  while (!queue_.empty() && cancelled(queue_.front())) pop();
  if (queue_.empty()) return false;
  now_ = queue_.front().when;
  // All of the instant's handlers are taken before any runs, as posting them would: one that a
  // handler cancels or sets for now still fires, or waits for the next call.
  auto firing = std::move(firing_);
  while (!queue_.empty() && queue_.front().when <= now_) {
    const auto e = queue_.front();
    pop();
    if (!cancelled(e)) firing.push_back(release(e.id));
  }
  for (auto& h : firing) h({});
  firing.clear();
  firing_ = std::move(firing);
  return true;
}

}  // namespace ferry
