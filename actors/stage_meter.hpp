#pragma once
/// Busy time of a pipeline stage: wall time during which at least one of its operations ran.
#include <chrono>

namespace ferry {

/// Owning loop only.
class stage_meter {
 public:
  void begin() {
    if (active_++ == 0) since_ = std::chrono::steady_clock::now();
  }
  void end() {
    if (--active_ == 0) busy_ += std::chrono::steady_clock::now() - since_;
  }
  double seconds() const { return std::chrono::duration<double>(busy_).count(); }
  void reset() { busy_ = {}; }

 private:
  int active_ = 0;
  std::chrono::steady_clock::time_point since_;
  std::chrono::steady_clock::duration busy_{};
};

}  // namespace ferry
