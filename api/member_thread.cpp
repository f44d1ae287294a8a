#include "api/member_thread.hpp"

#include <fmt/format.h>

#include <map>

#include "actors/messages.hpp"
#include "protocol/protocol.hpp"
#include "transport/link_auth.hpp"

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
  if (a.scheme != "tcp" && a.scheme != "cma" && a.scheme != "fabric" && a.scheme != "inproc") {
    why = fmt::format("address '{}': unknown scheme '{}' (tcp, cma, fabric or inproc)", address,
                      a.scheme);
    return std::nullopt;
  }
  if (a.scheme == "inproc" && a.rest.empty()) {
    why = fmt::format("address '{}': inproc://NAME needs a name", address);
    return std::nullopt;
  }
  return a;
}

std::shared_ptr<inproc_network> inproc_job_network(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<inproc_network>> networks;
  std::lock_guard lock(mutex);
  std::erase_if(networks, [](const auto& n) { return n.second.expired(); });
  auto& slot = networks[name];
  auto network = slot.lock();
  if (!network) slot = network = std::make_shared<inproc_network>();
  return network;
}

status load_secret(const std::string& scheme, const std::string& given, bool allow_unauthenticated,
                   link_settings& settings) {
  allow_unauthenticated = allow_unauthenticated || scheme == "inproc";
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
                            std::function<status(node&)> setup, std::function<void(node&)> teardown,
                            int device) {
  std::promise<status> opened;
  auto result = opened.get_future();
  thread_ =
      std::thread([this, scheme, self, settings = std::move(settings), setup = std::move(setup),
                   teardown = std::move(teardown), device, &opened]() mutable {
        run(scheme, self, settings, std::move(setup), std::move(teardown), device, opened);
      });
  auto s = result.get();
  if (!s) stop();
  return s;
}

void member_thread::run(const std::string& scheme, node_id self, const link_settings& link,
                        std::function<status(node&)> setup, std::function<void(node&)> teardown,
                        int device, std::promise<status>& opened) {
  event_loop loop;
  std::unique_ptr<member_gpu> gpu;  // outlives the environment, which copies with it
  if (device >= 0) {
    std::string why;
    gpu = open_member_gpu(loop, device, why);
    if (!gpu) return opened.set_value(failed(api_errc::invalid_argument, why));
  }
  gpu_ = gpu.get();
  real_environment env(loop, gpu ? gpu->copies.get() : nullptr);
  transport_settings settings;
  settings.secret = link.secret;
  settings.allow_unauthenticated = link.allow_unauthenticated;
  settings.bind_host = link.bind_host;
  settings.port = link.port;
  settings.fabric_provider = link.fabric_provider;
  // inproc://NAME: every object of this process naming NAME shares one network.
  const auto network = scheme == "inproc" ? inproc_job_network(link.inproc_job) : nullptr;
  if (network && network->find(self)) {
    return opened.set_value(failed(
        api_errc::invalid_argument,
        fmt::format("inproc://{}: node {} is already there (one coordinator per name, and unique "
                    "shards and (instance, rank)s)",
                    link.inproc_job, self)));
  }
  auto t = network ? result<std::shared_ptr<transport>>(inproc_transport::make(env, *network, self))
                   : make_transport(scheme, env, self, settings);
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
