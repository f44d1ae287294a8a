#pragma once
/// One object derived from some others, made once for every caller in the process that derives it
/// from the very same ones: a simulation's hundreds of members of one table keep one placement of
/// a plan in it, and send one registration of it.
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

namespace ferry {

/// What `make()` returns for `sources`, shared with every caller that passes these same objects
/// while any caller keeps it. Thread-safe.
template <class T, class Make, class... Sources>
std::shared_ptr<const T> shared_per_sources(Make make,
                                            const std::shared_ptr<const Sources>&... sources) {
  struct entry {
    std::tuple<std::weak_ptr<const Sources>...> sources;
    std::weak_ptr<const T> made;
  };
  static std::mutex mutex;
  static std::map<std::tuple<const Sources*...>, entry> made;
  std::lock_guard lock(mutex);
  std::erase_if(made, [](const auto& e) { return e.second.made.expired(); });
  auto& e = made[{sources.get()...}];
  // The same addresses may be new objects: only the very ones it was made from match.
  if (auto live = e.made.lock();
      live && std::apply([&](const auto&... weak) { return ((weak.lock() == sources) && ...); },
                         e.sources)) {
    return live;
  }
  std::shared_ptr<const T> fresh = make();
  e = {.sources = {sources...}, .made = fresh};
  return fresh;
}

}  // namespace ferry
