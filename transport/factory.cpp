#include "transport/factory.hpp"

namespace ferry {

result<std::shared_ptr<transport>> make_transport(const std::string& scheme, event_loop& loop, node_id self,
                                                  transport_environment& environment) {
  if (scheme == "inproc") return inproc_transport::make(loop, environment.inproc, self);
  return fail(errc::invalid_argument);
}

}  // namespace ferry
