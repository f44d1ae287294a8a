#pragma once
/// Frames that arrive in pieces: a provider that completes only what it copies in the call (shm,
/// `inject_only`) sends a larger frame as fragments, and the last piece completes it. One frame
/// at a time per sender, as a link's messages arrive in order.
#include <cstddef>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/message.hpp"

namespace ferry::fabric_link {

/// Owning loop only.
class frame_assembly {
 public:
  explicit frame_assembly(std::size_t max_frame) : max_frame_(max_frame) {}

  /// What a piece made of its frame.
  enum class piece_state {
    more,        ///< a fragment kept; more follow
    whole,       ///< the frame is whole
    dropped,     ///< the last piece of a frame already over the limit
    over_limit,  ///< this piece took its frame over the limit: the rest of it is dropped too
  };
  struct outcome {
    piece_state state;
    std::span<const std::byte> frame;  ///< when whole, valid until the next `add`
  };
  /// A piece of `from`'s current frame; `last` for its final one (a frame in one piece is one).
  outcome add(node_id from, std::span<const std::byte> piece, bool last);
  /// Forgets the frame `from` was sending.
  void forget(node_id from) { partial_.erase(from); }

 private:
  struct partial {
    std::vector<std::byte> bytes;
    bool dropped = false;
  };

  std::size_t max_frame_;
  std::unordered_map<node_id, partial> partial_;
  std::vector<std::byte> whole_;  ///< the last frame made of pieces
};

}  // namespace ferry::fabric_link
