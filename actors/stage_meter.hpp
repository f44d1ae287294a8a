#pragma once
/// One pipeline stage of one actor: its busy time (time during which at least one of its
/// operations ran), and each operation on the environment's timeline.
#include "runtime/clock.hpp"
#include "runtime/environment.hpp"
#include "runtime/message.hpp"
#include "runtime/trace.hpp"

namespace ferry {

/// Owning loop only.
class stage_meter {
 public:
  stage_meter(environment& env, node_id node, stage what) : env_(env), node_(node), what_(what) {}

  /// When an operation began; give it back to `end`.
  using started = clock::time_point;
  started begin() {
    const auto now = env_.clock().now();
    if (active_++ == 0) since_ = now;
    return now;
  }
  void end(started at, std::uint64_t version, std::uint32_t chunk, std::uint64_t bytes) {
    const auto now = env_.clock().now();
    if (--active_ == 0) busy_ += now - since_;
    env_.trace().record({.node = node_,
                         .what = what_,
                         .version = version,
                         .chunk = chunk,
                         .bytes = bytes,
                         .start_ns = at.time_since_epoch().count(),
                         .end_ns = now.time_since_epoch().count()});
  }
  double seconds() const { return std::chrono::duration<double>(busy_).count(); }
  void reset() { busy_ = {}; }

 private:
  environment& env_;
  node_id node_;
  stage what_;
  int active_ = 0;
  clock::time_point since_{};
  clock::duration busy_{};
};

}  // namespace ferry
