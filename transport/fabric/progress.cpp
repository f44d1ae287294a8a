#include "transport/fabric/progress.hpp"

#include <algorithm>
#include <boost/fiber/operations.hpp>

namespace ferry::fabric_link {
namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

/// How long progress stays continuous after the last completion, notice, frame or wake-up by the
/// wait fd. A target polls on while writes stream in: each keeps it within this window of the last.
constexpr auto active_window = steady::duration(2ms);
/// First poll period when idle without a usable wait fd; it doubles up to `idle_interval`.
constexpr auto first_idle_poll = steady::duration(20us);
/// Longest pause between polls when idle and the provider gives no wait fd.
constexpr auto idle_interval = steady::duration(2ms);

}  // namespace

progress_driver::progress_driver(event_loop& loop, int wait_fd, hooks h)
    : loop_(loop), hooks_(std::move(h)), timer_(loop.io()) {
  if (wait_fd >= 0) wait_fd_.emplace(loop.io(), wait_fd);
}

void progress_driver::start() {
  running_ = true;
  kick();
}

void progress_driver::stop() {
  running_ = false;
  timer_.cancel();
  if (!wait_fd_) return;
  boost::system::error_code ignored;
  wait_fd_->cancel(ignored);
  wait_fd_->release();
  wait_fd_.reset();
}

bool progress_driver::hot() const {
  return hooks_.busy() || steady::now() < active_until_;
}

void progress_driver::kick() {
  if (!running_) return;
  auto keep = shared_from_this();
  const int handled = hooks_.drain();
  if (!running_) return;
  if (handled > 0) active_until_ = steady::now() + active_window;
  // Quiet turns back the polling off, work in flight or not: with a wait fd, the fd wakes us
  // for what it covers, and the timer for what it may not (rxm's connection set-up).
  if (handled > 0 || (hooks_.busy() && !wait_fd_))
    idle_streak_ = 0;
  else if (idle_streak_ < 16)
    ++idle_streak_;
  rearm();
}

void progress_driver::poke() {
  idle_streak_ = 0;
  start_pump();
}

/// While hot, a fiber posts one kick per loop turn and yields: progress is continuous, and
/// other handlers and fibers still take turns. (A handler that re-posted itself would keep
/// io_context::poll() from returning, and event_loop::turn runs fibers only after it does.)
void progress_driver::start_pump() {
  if (pumping_ || !running_) return;
  pumping_ = true;
  loop_.spawn([weak = weak_from_this()] {
    for (;;) {
      {
        auto self = weak.lock();
        if (!self) return;
        // Our last kick has not run: the loop runs no handlers (it stopped, or the thread is
        // exiting and only fibers are resumed). Stop; that kick restarts us if it ever runs.
        if (!self->running_ || self->kick_posted_) {
          self->pumping_ = false;
          return;
        }
        if (!self->hot() || self->arm_wait_fd()) {
          self->pumping_ = false;
          self->rearm();  // back to the wait fd or the backing-off timer
          return;
        }
        self->kick_posted_ = true;
        self->loop_.post([weak] {
          if (auto s = weak.lock()) {
            s->kick_posted_ = false;
            s->kick();
          }
        });
      }
      boost::this_fiber::yield();
    }
  });
}

/// Sleeps on the wait fd when the provider says that is safe, work in flight or not; false when
/// it is not, or there is no fd.
bool progress_driver::arm_wait_fd() {
  if (!wait_fd_) return false;
  if (fd_armed_) return true;
  if (!hooks_.may_sleep()) return false;
  fd_armed_ = true;
  wait_fd_->async_wait(boost::asio::posix::stream_descriptor::wait_read,
                       [weak = weak_from_this()](const boost::system::error_code& ec) {
                         auto self = weak.lock();
                         if (!self || ec == boost::asio::error::operation_aborted) return;
                         self->fd_armed_ = false;
                         // Bytes are arriving: a large write streams in long before its
                         // completion, and moves only while we poll.
                         self->active_until_ = steady::now() + active_window;
                         self->kick();
                       });
  return true;
}

void progress_driver::rearm() {
  // Progress runs continuously while work is in flight, unless the provider lets us sleep on
  // its fd: a core spinning for every busy process starves the others on a shared host.
  const bool fd_ok = arm_wait_fd();
  if (hot() && !fd_ok) return start_pump();
  // Idle: sleep on the fd alone; with work in flight, or without an fd (or while fi_trywait
  // says events are pending), also poll on a timer that backs off while nothing happens.
  if (fd_ok && idle_streak_ > 0 && !hooks_.busy()) return;
  arm_timer(std::min(first_idle_poll * (1u << std::min(idle_streak_, 8u)), idle_interval));
}

void progress_driver::arm_timer(steady::duration after) {
  const auto deadline = steady::now() + after;
  if (timer_armed_ && timer_deadline_ <= deadline) return;
  timer_armed_ = true;
  timer_deadline_ = deadline;
  timer_.expires_at(deadline);
  timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
    auto self = weak.lock();
    if (!self || ec == boost::asio::error::operation_aborted) return;
    self->timer_armed_ = false;
    self->kick();
  });
}

}  // namespace ferry::fabric_link
