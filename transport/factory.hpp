#pragma once
/// Creating a transport by scheme name, for jobs and the CLI: "inproc" (one process), "tcp",
/// "cma" (tcp links, bulk bytes copied by the kernel between processes of one host) and "fabric".
#include <memory>
#include <string>
#include <vector>

#include "runtime/environment.hpp"
#include "runtime/transport.hpp"
#include "transport/inproc/inproc_transport.hpp"

namespace ferry {

/// What the transports of one process share: the inproc directory, the job secret, where to
/// bind, the libfabric provider. Outlives every transport made from it.
struct transport_settings {
  inproc_network inproc;
  std::vector<std::byte> secret;  ///< the job secret of tcp, cma and fabric; empty: unauthenticated
  bool allow_unauthenticated = false;  ///< links without a secret (tests, in-process jobs)
  std::string bind_host =
      "127.0.0.1";              ///< tcp/cma: the address to bind; fabric: the node to open on
  std::uint16_t port = 0;       ///< tcp/cma: 0 picks a free port
  std::string fabric_provider;  ///< "" picks the best available
};

/// The transport for `scheme` on `env`'s loop, or `errc::invalid_argument` for an unknown scheme
/// or one that does real I/O on a virtual environment (only inproc runs on virtual time).
result<std::shared_ptr<transport>> make_transport(const std::string& scheme, environment& env,
                                                  node_id self, transport_settings& settings);

}  // namespace ferry
