#pragma once
/// Which host and pid namespace this process runs in, so that a pid received from a peer is only
/// acted on (read with process_vm_readv, opened under /proc) where it names the peer's process.
#include <cstdint>

namespace ferry {

/// 64 bits naming this host, pid namespace and network namespace: XXH3-64 of the kernel's boot id
/// and of the namespaces' device and inode. Two processes may reach each other by pid only if
/// theirs are equal.
std::uint64_t same_host_tag();

}  // namespace ferry
