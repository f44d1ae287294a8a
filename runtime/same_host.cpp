#include "runtime/same_host.hpp"

#include <sys/stat.h>
#include <xxhash.h>

#include <fstream>
#include <string>

namespace ferry {

std::uint64_t same_host_tag() {
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  // Another network namespace counts as another host: its processes are a cluster's other nodes
  // in tests (and in containers that share a pid namespace).
  for (const char* kind : {"pid", "net"}) {
    struct stat ns {};
    if (::stat((std::string("/proc/self/ns/") + kind).c_str(), &ns) == 0) {
      boot_id += std::string("/") + kind + ":" + std::to_string(ns.st_dev) + ":" +
                 std::to_string(ns.st_ino);
    }
  }
  return XXH3_64bits(boot_id.data(), boot_id.size());
}

}  // namespace ferry
