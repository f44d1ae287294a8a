#include "api/member_thread.hpp"

#include <fmt/format.h>

#include "actors/messages.hpp"
#include "transport/tcp/link_auth.hpp"

namespace ferry::api {

status failed(api_errc e, std::string message) {
  return {make_error_code(e), std::move(message)};
}

std::optional<parsed_address> parse_address(const std::string& address, std::string& why) {
  const auto sep = address.find("://");
  if (sep == std::string::npos || sep == 0) {
    why = fmt::format(
        "address '{}': expected scheme://... (tcp://host:port, cma://host:port, fabric://provider)",
        address);
    return std::nullopt;
  }
  parsed_address a{address.substr(0, sep), address.substr(sep + 3)};
  if (a.scheme == "inproc") {
    why = fmt::format(
        "address '{}': inproc links one loop's nodes; API objects each run their own (use tcp)",
        address);
    return std::nullopt;
  }
  if (a.scheme != "tcp" && a.scheme != "cma" && a.scheme != "fabric") {
    why = fmt::format("address '{}': unknown scheme '{}' (tcp, cma or fabric)", address, a.scheme);
    return std::nullopt;
  }
  return a;
}

status load_secret(const std::string& given, bool allow_unauthenticated, link_settings& settings) {
  settings.allow_unauthenticated = allow_unauthenticated;
  if (!given.empty()) {
    if (given.size() < min_secret_bytes) {
      return failed(api_errc::invalid_argument,
                    fmt::format("the job secret has {} bytes; at least {} are needed", given.size(),
                                min_secret_bytes));
    }
    for (char c : given) settings.secret.push_back(static_cast<std::byte>(c));
    return {};
  }
  auto secret = load_job_secret();
  if (!secret)
    return failed(api_errc::invalid_argument,
                  "FERRY_SECRET_FILE / FERRY_SECRET: " + secret.error().message());
  settings.secret = *secret;
  if (settings.secret.empty() && !allow_unauthenticated) {
    return failed(api_errc::invalid_argument,
                  "no job secret: set options.secret, FERRY_SECRET_FILE or FERRY_SECRET (or "
                  "allow_unauthenticated)");
  }
  return {};
}

status member_thread::start(const std::string& scheme, node_id self, link_settings settings,
                            std::function<status(node&)> setup,
                            std::function<void(node&)> teardown) {
  std::promise<status> opened;
  auto result = opened.get_future();
  thread_ =
      std::thread([this, scheme, self, settings = std::move(settings), setup = std::move(setup),
                   teardown = std::move(teardown), &opened]() mutable {
        run(scheme, self, settings, std::move(setup), std::move(teardown), opened);
      });
  auto s = result.get();
  if (!s) stop();
  return s;
}

void member_thread::run(const std::string& scheme, node_id self, const link_settings& link,
                        std::function<status(node&)> setup, std::function<void(node&)> teardown,
                        std::promise<status>& opened) {
  event_loop loop;
  real_environment env(loop);
  transport_settings settings;
  settings.secret = link.secret;
  settings.allow_unauthenticated = link.allow_unauthenticated;
  settings.bind_host = link.bind_host;
  settings.port = link.port;
  settings.fabric_provider = link.fabric_provider;
  auto t = make_transport(scheme, env, self, settings);
  if (!t)
    return opened.set_value(
        failed(api_errc::invalid_argument, "cannot open the transport: " + t.error().message()));
  node host(env, self, *t, protocol());
  if (auto ec = host.start())
    return opened.set_value(
        failed(api_errc::unreachable, "cannot start the node: " + ec.message()));
  if (auto s = setup(host); !s) {
    teardown(host);
    host.close();
    return opened.set_value(s);
  }
  {
    std::lock_guard lock(mutex_);
    loop_ = &loop;
  }
  opened.set_value({});
  loop.run_until([this] { return stopping_; });
  teardown(host);
  host.close();
}

void member_thread::post(std::function<void()> fn) {
  std::lock_guard lock(mutex_);
  if (loop_) loop_->post(std::move(fn));
}

status member_thread::call(std::function<status()> fn) {
  std::promise<status> done;
  auto result = done.get_future();
  {
    std::lock_guard lock(mutex_);
    if (!loop_) return failed(api_errc::closed, "closed");
    loop_->post([&done, fn = std::move(fn)] { done.set_value(fn()); });
  }
  return result.get();
}

void member_thread::stop(std::function<void()> before_stop) {
  {
    std::lock_guard lock(mutex_);
    if (loop_) {
      loop_->post([this, before_stop = std::move(before_stop)] {
        if (before_stop) before_stop();
        stopping_ = true;
      });
      loop_ = nullptr;
    }
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

}  // namespace ferry::api
