/// libFuzzer target: control-frame decoding (`decode_frame`, `decode_payload`) over the full
/// protocol registry, and every kind's body decoder over whatever body the input carries.
/// Properties beyond "does not crash": whatever decodes as a message type re-encodes to a frame
/// that decodes again, and re-encoding that is byte-identical (encode is a fixed point); the
/// one-pass decoder and msgpack-c's come to the same error or the same message.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "protocol/protocol.hpp"
#include "runtime/codec.hpp"
#include "sample_messages.hpp"

namespace {

using namespace ferry;

[[noreturn]] void broken(const char* what, msg_kind kind) {
  std::fprintf(stderr, "frame_fuzzer: property violated for kind %u: %s\n", kind, what);
  std::abort();
}

/// Re-encodes `m` and checks that the frame decodes to the same bytes again.
template <class M>
void round_trip(const envelope_header& head, const M& m) {
  const frame first = encode(head, m);
  auto again = decode_frame(first, protocol(), codec_limits{});
  if (!again) broken("a re-encoded message does not decode", M::kind);
  if (again->head.kind != M::kind || again->head.from != head.from || again->head.to != head.to ||
      again->head.epoch != head.epoch) {
    broken("the header changed in a round trip", M::kind);
  }
  std::optional<M> decoded;
  try {
    decoded = again->as<M>();
  } catch (const std::exception&) {
    broken("a re-encoded body does not convert back", M::kind);
  }
  const frame second = encode(again->head, *decoded);
  if (first != second) broken("re-encoding is not byte-identical", M::kind);
}

/// Checks one kind's body decoders against `body`: the registry accepts exactly what the typed
/// decoder converts and the message's `valid()` (where it has one) holds, and that must round-trip.
template <class M>
void check_kind(const envelope_header& head, const msgpack::object& body) {
  const auto* entry = protocol().find(M::kind);
  if (!entry) broken("a protocol message is not registered", M::kind);
  const bool accepted = entry->accepts(body);
  std::optional<M> m;
  try {
    m = body.as<M>();
  } catch (const std::exception&) {
  }
  if constexpr (requires(const M& x) { x.valid(); }) {
    if (m && !m->valid()) m.reset();
  }
  if (accepted != m.has_value()) broken("the registry and the typed decoder disagree", M::kind);
  if (m) round_trip(head, *m);
}

using kind_check = void (*)(const envelope_header&, const msgpack::object&);

/// One check per message type, collected once (the examples are built only here).
const std::vector<kind_check>& kind_checks() {
  static const std::vector<kind_check> checks = [] {
    std::vector<kind_check> v;
    fuzz::for_each_message([&]<class M>(const M&) { v.push_back(&check_kind<M>); });
    return v;
  }();
  return checks;
}

/// Feeds the body an envelope carries (its sixth element), valid envelope or not, to every
/// kind's body decoders.
void every_body_decoder(const envelope_header& head, std::span<const std::byte> payload,
                        const codec_limits& limits) {
  msgpack::object_handle handle;
  try {
    std::size_t offset = 0;
    const msgpack::unpack_limit caps(limits.max_array, limits.max_map, limits.max_str,
                                     limits.max_bin, limits.max_bin, limits.max_depth);
    handle = msgpack::unpack(reinterpret_cast<const char*>(payload.data()), payload.size(), offset,
                             nullptr, nullptr, caps);
  } catch (const std::exception&) {
    return;
  }
  const auto& root = handle.get();
  if (root.type != msgpack::type::ARRAY || root.via.array.size != 6) return;
  for (auto check : kind_checks()) check(head, root.via.array.ptr[5]);
}

/// Each kind's message encoded again, to compare what two decoders made of one payload.
frame encoded_again(const decoded_message& m) {
  static const auto encoders = [] {
    std::map<msg_kind, frame (*)(const decoded_message&)> e;
    fuzz::for_each_message([&]<class M>(const M&) {
      e[M::kind] = [](const decoded_message& d) { return encode(d.head, d.as<M>()); };
    });
    return e;
  }();
  return encoders.at(m.head.kind)(m);
}

void same_as_msgpack_c(std::span<const std::byte> payload, const result<decoded_message>& ours,
                       const codec_limits& limits) {
  const auto theirs = detail::decode_through_msgpack_c(payload, protocol(), limits);
  if (ours.has_value() != theirs.has_value()) broken("one-pass and msgpack-c decoding disagree", 0);
  if (!ours) {
    if (ours.error() != theirs.error())
      broken("one-pass and msgpack-c decoding give different errors", 0);
    return;
  }
  if (encoded_again(*ours) != encoded_again(*theirs))
    broken("one-pass and msgpack-c decoding give different messages", ours->head.kind);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span bytes(reinterpret_cast<const std::byte*>(data), size);
  const codec_limits limits{};
  const auto& registry = protocol();

  // The whole-frame path, as a transport hands frames over.
  if (auto m = decode_frame(bytes, registry, limits)) {
    if (registry.find(m->head.kind) == nullptr)
      broken("an unregistered kind decoded", m->head.kind);
    every_body_decoder(m->head, bytes.subspan(frame_prefix_bytes), limits);
  }
  // The payload path (tcp strips the prefix), whatever the prefix says. Rejected envelopes may
  // still carry a body: every body decoder must survive it too.
  if (size >= frame_prefix_bytes) {
    const auto payload = bytes.subspan(frame_prefix_bytes);
    const auto m = decode_payload(payload, registry, limits);
    same_as_msgpack_c(payload, m, limits);
    every_body_decoder(m ? m->head : fuzz::sample_header(), payload, limits);
  }
  return 0;
}
