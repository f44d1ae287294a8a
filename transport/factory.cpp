#include "transport/factory.hpp"

#include "transport/fabric/fabric_transport.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace ferry {

result<std::shared_ptr<transport>> make_transport(const std::string& scheme, event_loop& loop, node_id self,
                                                  transport_environment& environment) {
  if (scheme == "inproc") return inproc_transport::make(loop, environment.inproc, self);
  if (scheme == "tcp" || scheme == "cma") {
    tcp_options options;
    options.bind_host = environment.bind_host;
    options.port = environment.port;
    options.secret = environment.secret;
    options.allow_unauthenticated = environment.allow_unauthenticated;
    options.same_host_copy = scheme == "cma";
    return tcp_transport::make(loop, self, options);
  }
  if (scheme == "fabric") {
    fabric_options options;
    options.provider = environment.fabric_provider;
    auto t = fabric_transport::make(loop, self, options);
    if (!t) return fail(t.error());
    return std::shared_ptr<transport>(*t);
  }
  return fail(errc::invalid_argument);
}

}  // namespace ferry
