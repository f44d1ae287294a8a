#include "transport/factory.hpp"

#include "transport/fabric/fabric_transport.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace ferry {

result<std::shared_ptr<transport>> make_transport(const std::string& scheme, environment& env,
                                                  node_id self, transport_settings& settings) {
  if (scheme == "inproc") return inproc_transport::make(env, settings.inproc, self);
  // Real I/O would block a loop whose clock only moves when nothing is ready.
  if (env.is_virtual()) return fail(errc::invalid_argument);
  auto& loop = env.loop();
  if (scheme == "tcp" || scheme == "cma") {
    tcp_options options;
    options.bind_host = settings.bind_host;
    options.port = settings.port;
    options.secret = settings.secret;
    options.allow_unauthenticated = settings.allow_unauthenticated;
    options.same_host_copy = scheme == "cma";
    return tcp_transport::make(loop, self, options);
  }
  if (scheme == "fabric") {
    fabric_options options;
    options.provider = settings.fabric_provider;
    options.node = settings.bind_host;
    options.secret = settings.secret;
    options.allow_unauthenticated = settings.allow_unauthenticated;
    auto t = fabric_transport::make(loop, self, options);
    if (!t) return fail(t.error());
    return std::shared_ptr<transport>(*t);
  }
  return fail(errc::invalid_argument);
}

}  // namespace ferry
