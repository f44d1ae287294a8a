#include "runtime/clock.hpp"

#include <boost/asio/error.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

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
  const auto id = next_id_++;
  timers_.emplace(std::max(when, now_), std::pair{id, std::move(h)});
  return id;
}

void virtual_clock::cancel(std::uint64_t timer) {
  for (auto it = timers_.begin(); it != timers_.end(); ++it) {
    if (it->second.first == timer) {
      boost::asio::post(io_, [h = std::move(it->second.second)] {
        h(std::error_code(boost::asio::error::make_error_code(boost::asio::error::operation_aborted)));
      });
      timers_.erase(it);
      return;
    }
  }
}

void virtual_clock::advance_to(time_point t) {
  while (!timers_.empty() && timers_.begin()->first <= t) {
    auto node = timers_.extract(timers_.begin());
    now_ = node.key();
    boost::asio::post(io_, [h = std::move(node.mapped().second)] { h({}); });
  }
  if (t > now_) now_ = t;
}

bool virtual_clock::advance_to_next() {
  if (timers_.empty()) return false;
  advance_to(timers_.begin()->first);
  return true;
}

}  // namespace ferry
