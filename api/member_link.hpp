#pragma once
/// A member's link to its coordinator, from joining to leaving: where the coordinator is and how
/// the member's transport is opened, and what a member does on its loop thread as it joins and
/// as it goes.
#include <chrono>
#include <string>

#include "actors/coordinator.hpp"
#include "actors/job_member.hpp"
#include "api/member_thread.hpp"
#include "ferry/ferry.hpp"
#include "runtime/node.hpp"

namespace ferry::api {

/// How a member reaches its coordinator: the transport's scheme, its settings (the job secret,
/// the fabric provider) and the coordinator's transport address.
struct member_link {
  std::string scheme;
  link_settings settings;
  std::string coordinator;
};
/// Reads `o.coordinator` (and the secret, and where to listen) into `out`.
status link_to_coordinator(const member_options& o, const char* who, member_link& out);
/// Loop thread: tells `host`'s transport where the coordinator is.
status reach_coordinator(node& host, const std::string& address, const char* who);

/// Lets what the actors just sent (a leave, a job stop) reach the wire before the node goes.
void drain(node& host, std::chrono::milliseconds period);
/// Loop thread: a closing member leaves the job saying `reason`, and its last frame gets time to
/// go out. A failed member leaves nothing: the error it sent the coordinator gets that time (a
/// worker that closed at once had its error die with its links, and the coordinator waited out
/// its timeout). After the job's end it only lingers, so that the other members hear the end
/// before its links close.
void depart(node& host, job_member& member, const std::string& reason);

/// Loop thread: a member with a trace file keeps its timeline, and writes it as it closes.
void keep_trace(node& host, const std::string& file);
void write_trace(node& host, const std::string& file);

}  // namespace ferry::api
