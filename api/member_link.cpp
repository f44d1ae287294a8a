#include "api/member_link.hpp"

#include <fmt/format.h>

#include "runtime/log.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace ferry::api {

status link_to_coordinator(const member_options& o, const char* who, member_link& out) {
  std::string why;
  auto a = api::parse_address(o.coordinator, why);
  if (!a) return failed(api_errc::invalid_argument, fmt::format("{}: {}", who, why));
  out.scheme = a->scheme;
  out.coordinator = a->rest;
  if (a->scheme == "fabric") {  // fabric://PROVIDER/ENDPOINT
    const auto slash = a->rest.find('/');
    if (slash == std::string::npos) {
      return failed(
          api_errc::invalid_argument,
          fmt::format("{}: address '{}': expected fabric://provider/endpoint", who, o.coordinator));
    }
    out.settings.fabric_provider = a->rest.substr(0, slash);
    out.coordinator = a->rest.substr(slash + 1);
  }
  if (a->scheme == "inproc") {  // inproc://NAME: the coordinator is node 0 of that network
    out.settings.inproc_job = a->rest;
    out.coordinator = std::to_string(coordinator_node);
  }
  // Other members connect to this one: it listens where the coordinator's side can reach it.
  if (!o.listen_host.empty()) {
    out.settings.bind_host = o.listen_host;
  } else if (a->scheme == "tcp" || a->scheme == "cma") {
    if (auto local = local_host_toward(out.coordinator); !local.empty())
      out.settings.bind_host = local;
  }
  return api::load_secret(a->scheme, o.secret, o.allow_unauthenticated, out.settings);
}

status reach_coordinator(node& host, const std::string& address, const char* who) {
  if (auto ec = host.transport().add_peer(coordinator_node, address)) {
    return failed(api_errc::invalid_argument,
                  fmt::format("{}: coordinator '{}': {}", who, address, ec.message()));
  }
  return {};
}

void drain(node& host, std::chrono::milliseconds period) {
  bool done = false;
  const auto timer = host.clock().async_wait(period, [&](std::error_code) { done = true; });
  host.env().loop().run_until([&] { return done; });
  host.clock().cancel(timer);
}

void depart(node& host, job_member& member, const std::string& reason) {
  if (member.stopped()) {
    drain(host, std::chrono::milliseconds(100));
    return;
  }
  if (!member.failed()) member.leave(reason);
  drain(host, std::chrono::milliseconds(200));
}

void keep_trace(node& host, const std::string& file) {
  if (!file.empty()) host.env().trace().keep_records();
}

void write_trace(node& host, const std::string& file) {
  if (file.empty()) return;
  if (auto ec = host.env().trace().write_chrome(file))
    log::error("cannot write the trace to {}: {}", file, ec.message());
}

}  // namespace ferry::api
