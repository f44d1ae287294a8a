#include "runtime/errc.hpp"

#include <string>

namespace ferry {
namespace {

struct runtime_category_impl final : std::error_category {
  const char* name() const noexcept override { return "ferry.runtime"; }
  std::string message(int c) const override {
    switch (static_cast<errc>(c)) {
      case errc::truncated_frame:
        return "truncated frame";
      case errc::oversize_frame:
        return "frame larger than the configured cap";
      case errc::malformed_frame:
        return "malformed frame: not a ferry envelope";
      case errc::wrong_protocol:
        return "wrong protocol version";
      case errc::unknown_kind:
        return "unknown message kind";
      case errc::malformed_body:
        return "message body does not match its kind";
      case errc::unknown_actor:
        return "no such actor on this node";
      case errc::unknown_peer:
        return "no route to that node";
      case errc::stopped:
        return "stopped";
      case errc::timed_out:
        return "timed out";
      case errc::invalid_argument:
        return "invalid argument";
      case errc::forged_sender:
        return "envelope sender does not match the link it came on";
      case errc::not_same_host:
        return "the peer runs on another host, or in another pid or network namespace: same-host "
               "copies cannot reach it";
    }
    return "unknown ferry.runtime error " + std::to_string(c);
  }
};

}  // namespace

const std::error_category& runtime_category() noexcept {
  static const runtime_category_impl category;
  return category;
}

}  // namespace ferry
