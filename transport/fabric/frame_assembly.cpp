#include "transport/fabric/frame_assembly.hpp"

namespace ferry::fabric_link {

frame_assembly::outcome frame_assembly::add(node_id from, std::span<const std::byte> piece,
                                            bool last) {
  using enum piece_state;
  auto it = partial_.find(from);
  if (last && it == partial_.end()) return {.state = whole, .frame = piece};
  auto& frame = it != partial_.end() ? it->second : partial_[from];
  outcome out{.state = more, .frame = {}};
  if (frame.dropped) {
    out.state = last ? dropped : more;
  } else if (frame.bytes.size() + piece.size() > max_frame_) {
    frame = {.bytes = {}, .dropped = true};
    out.state = over_limit;
  } else {
    frame.bytes.insert(frame.bytes.end(), piece.begin(), piece.end());
    if (last) {
      whole_ = std::move(frame.bytes);
      out = {.state = whole, .frame = whole_};
    }
  }
  if (last) partial_.erase(from);
  return out;
}

}  // namespace ferry::fabric_link
