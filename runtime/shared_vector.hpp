#pragma once
/// A vector that copies share and no one changes: a message field many messages of one process
/// carry (a simulation's hundreds of registrations of one 140k-tensor table) is one object. Its
/// msgpack form is the array a std::vector's is, so a field that becomes shared keeps its wire
/// form.
#include <atomic>
#include <cstddef>
#include <memory>
#include <msgpack.hpp>
#include <type_traits>
#include <utility>
#include <vector>

namespace ferry {

namespace detail {
struct size_counter;
/// What a shared_vector writes to a `size_counter` as its contents: their packed size in one call,
/// with this as the data, which the counter recognises and does not read.
inline constexpr char shared_contents_mark = 0;
}  // namespace detail

template <class T>
class shared_vector {
 public:
  using value_type = T;

  shared_vector() = default;
  /// Implicit, as the field it replaces took a vector.
  shared_vector(std::vector<T> items) : shared_(std::make_shared<const shared>(std::move(items))) {}

  const std::vector<T>& items() const { return shared_ ? shared_->items : none(); }
  auto begin() const { return items().begin(); }
  auto end() const { return items().end(); }
  std::size_t size() const { return items().size(); }
  bool empty() const { return items().empty(); }
  const T& operator[](std::size_t i) const { return items()[i]; }

  /// Whether both are copies of one vector (equal without comparing a single item).
  bool same_object(const shared_vector& other) const { return shared_ == other.shared_; }
  friend bool operator==(const shared_vector& a, const shared_vector& b) {
    return a.same_object(b) || a.items() == b.items();
  }

  /// The bytes its msgpack array takes, counted once for all copies. Thread-safe.
  std::size_t packed_bytes() const {
    if (!shared_) return 1;  // an empty array's one byte
    auto bytes = shared_->packed_bytes.load(std::memory_order_relaxed);
    if (bytes == 0) {
      counter c;
      msgpack::packer<counter> packer(c);
      packer.pack(shared_->items);
      bytes = c.bytes;
      shared_->packed_bytes.store(bytes, std::memory_order_relaxed);
    }
    return bytes;
  }

 private:
  struct counter {
    std::size_t bytes = 0;
    void write(const char*, std::size_t n) { bytes += n; }
  };
  struct shared {
    explicit shared(std::vector<T> v) : items(std::move(v)) {}
    std::vector<T> items;
    mutable std::atomic<std::size_t> packed_bytes = 0;  ///< 0: not counted yet
  };
  static const std::vector<T>& none() {
    static const std::vector<T> empty_vector;
    return empty_vector;
  }
  std::shared_ptr<const shared> shared_;
};

template <class T>
inline constexpr bool is_shared_vector = false;
template <class T>
inline constexpr bool is_shared_vector<shared_vector<T>> = true;

}  // namespace ferry

namespace msgpack {
MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS) {
  namespace adaptor {

  template <class T>
  struct pack<ferry::shared_vector<T>> {
    template <class Stream>
    packer<Stream>& operator()(packer<Stream>& o, const ferry::shared_vector<T>& v) const {
      if constexpr (std::is_same_v<Stream, ferry::detail::size_counter>) {
        // A frame's size is counted for each message that carries the vector; its items once.
        o.pack_bin_body(&ferry::detail::shared_contents_mark,
                        static_cast<std::uint32_t>(v.packed_bytes()));
        return o;
      } else {
        return o.pack(v.items());
      }
    }
  };

  template <class T>
  struct convert<ferry::shared_vector<T>> {
    const msgpack::object& operator()(const msgpack::object& o, ferry::shared_vector<T>& v) const {
      std::vector<T> items;
      o.convert(items);
      v = ferry::shared_vector<T>(std::move(items));
      return o;
    }
  };

  }  // namespace adaptor
}  // MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS)
}  // namespace msgpack
