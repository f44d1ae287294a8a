#include "actors/messages.hpp"

namespace ferry {

void register_actor_messages(message_registry& r) {
  r.add<register_trainer>("register_trainer");
  r.add<register_worker>("register_worker");
  r.add<plan_ready>("plan_ready");
  r.add<worker_ready>("worker_ready");
  r.add<job_ready>("job_ready");
  r.add<job_failed>("job_failed");
  r.add<job_stop>("job_stop");
  r.add<publish_started>("publish_started");
  r.add<shard_offloaded>("shard_offloaded");
  r.add<chunk_sent>("chunk_sent");
  r.add<slot_free>("slot_free");
  r.add<slot_request>("slot_request");
  r.add<slot_grant>("slot_grant");
  r.add<chunk_announce>("chunk_announce");
  r.add<version_complete>("version_complete");
  r.add<version_delivered>("version_delivered");
  r.add<participant_error>("participant_error");
  r.add<shard_done>("shard_done");
  r.add<update_go>("update_go");
  r.add<update_failed>("update_failed");
  r.add<heartbeat>("heartbeat");
  r.add<leave_job>("leave_job");
  r.add<shard_sent>("shard_sent");
  r.add<peer_unreachable>("peer_unreachable");
  r.add<register_again>("register_again");
}

}  // namespace ferry
