#include "transport/errc.hpp"

#include <string>

#include "runtime/errc.hpp"

namespace ferry {
namespace {

struct transport_category_impl final : std::error_category {
  const char* name() const noexcept override { return "ferry.transport"; }
  std::string message(int c) const override {
    switch (static_cast<transport_errc>(c)) {
      case transport_errc::unknown_region:
        return "write into a region the peer never registered";
      case transport_errc::key_mismatch:
        return "region key mismatch";
      case transport_errc::out_of_bounds:
        return "write past the region's end";
      case transport_errc::not_registered:
        return "local buffer is not inside a registered region";
      case transport_errc::peer_unreachable:
        return "peer unreachable";
      case transport_errc::connection_lost:
        return "connection lost";
      case transport_errc::protocol_violation:
        return "peer violated the link protocol";
      case transport_errc::bad_address:
        return "malformed transport address";
      case transport_errc::provider_error:
        return "transport provider error";
      case transport_errc::unauthenticated:
        return "peer not authenticated";
      case transport_errc::limit_exceeded:
        return "per-peer limit exceeded";
      case transport_errc::copy_not_permitted:
        return "same-host copy not permitted (ptrace rules: kernel.yama.ptrace_scope)";
      case transport_errc::copy_failed:
        return "same-host copy failed";
      case transport_errc::peer_stalled:
        return "peer stopped taking what we send";
      case transport_errc::not_same_host:
        return make_error_code(errc::not_same_host).message();
    }
    return "unknown ferry.transport error " + std::to_string(c);
  }
};

}  // namespace

const std::error_category& transport_category() noexcept {
  static const transport_category_impl category;
  return category;
}

}  // namespace ferry
