#include "api/member_table.hpp"

namespace ferry::api {
namespace {

/// "device 3", "host memory".
std::string where(int device) {
  return device >= 0 ? fmt::format("device {}", device) : "host memory";
}

}  // namespace

std::optional<tensor_ref> to_ref(const tensor& t, bool data_required, std::string& why) {
  if (t.name.empty()) return why = "a tensor without a name", std::nullopt;
  auto type = parse_dtype(t.dtype);
  if (!type)
    return why = fmt::format("tensor '{}': unknown dtype '{}'", t.name, t.dtype), std::nullopt;
  for (auto d : t.shape) {
    if (d < 0)
      return why = fmt::format("tensor '{}': negative dimension {}", t.name, d), std::nullopt;
  }
  if ((data_required || t.device >= 0) && !t.data)
    return why = fmt::format("tensor '{}': null data pointer", t.name), std::nullopt;
  auto spec = make_tensor_spec(t.name, *type, t.shape);
  if (spec.nbytes == 0) return why = fmt::format("tensor '{}': zero bytes", t.name), std::nullopt;
  return tensor_ref{
      .spec = std::move(spec), .data = static_cast<std::byte*>(t.data), .device = t.device};
}

status member_device(const std::vector<tensor_ref>& tensors, const char* who, int& device) {
  device = tensors.empty() ? -1 : tensors.front().device;
  for (const auto& t : tensors) {
    if (t.device != device) {
      return failed(
          api_errc::invalid_argument,
          fmt::format("{}: tensor '{}' is in {} and tensor '{}' in {}: one device per member", who,
                      tensors.front().spec.name, where(device), t.spec.name, where(t.device)));
    }
  }
  return {};
}

}  // namespace ferry::api
