#pragma once
/// The job's protocol: every message a ferry node decodes, composed of the runtime's, the actors'
/// and each collective's. Composed here, above both, so that the actors link no collective.
#include "runtime/message_registry.hpp"

namespace ferry {

const message_registry& protocol();

}  // namespace ferry
