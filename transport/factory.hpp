#pragma once
/// Creating a transport by scheme name ("inproc", "tcp", "fabric"), for jobs and the CLI.
#include <memory>
#include <string>

#include "runtime/event_loop.hpp"
#include "transport/inproc/inproc_transport.hpp"
#include "transport/transport.hpp"

namespace ferry {

/// What the transports of one process share: the inproc directory, the job secret, provider
/// choices. Outlives every transport made from it.
struct transport_environment {
  inproc_network inproc;
  std::string secret;              ///< job secret for tcp's handshake; empty: unauthenticated
  bool allow_unauthenticated = true;
  std::string fabric_provider;     ///< "" picks the best available
};

/// The transport for `scheme`, or `errc::invalid_argument` for an unknown scheme.
result<std::shared_ptr<transport>> make_transport(const std::string& scheme, event_loop& loop, node_id self,
                                                  transport_environment& environment);

}  // namespace ferry
