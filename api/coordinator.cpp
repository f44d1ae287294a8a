// The public coordinator: a job_coordinator on a loop thread of its own.
#include "actors/coordinator.hpp"

#include <fmt/format.h>

#include <condition_variable>
#include <mutex>

#include "api/member_link.hpp"
#include "api/member_table.hpp"
#include "ferry/ferry.hpp"
#include "runtime/log.hpp"

namespace ferry {

using namespace api;

struct coordinator::impl {
  api::member_thread thread;
  std::unique_ptr<job_coordinator> actor;  ///< loop thread only
  std::string address;
  mutable std::mutex mutex;
  mutable std::condition_variable changed;
  std::uint64_t delivered = 0;
  std::optional<std::string> failure;
  bool closed = false;
};

coordinator::coordinator(options o, status& ok) : impl_(std::make_unique<impl>()) {
  ok = open(std::move(o));
}

namespace {

/// The job's shape from the coordinator's options, refused where they cannot make a job.
status shape_of(const coordinator::options& o, job_shape& shape) {
  const auto p2p = parse_p2p_mode(o.p2p);
  if (!p2p)
    return failed(api_errc::invalid_argument,
                  "coordinator: p2p '" + o.p2p + "': auto, device or host");
  if (o.trainers == 0 || o.instance_sizes.empty() ||
      std::find(o.instance_sizes.begin(), o.instance_sizes.end(), 0u) != o.instance_sizes.end()) {
    return failed(api_errc::invalid_argument,
                  "coordinator: at least one trainer, and instances of at least one worker");
  }
  if (auto no = chunk_bytes_refusal(o.chunk_bytes))
    return failed(api_errc::invalid_argument,
                  fmt::format("coordinator: chunk_bytes {}: {}", o.chunk_bytes, *no));
  if (auto no = depth_refusal(o.depth))
    return failed(api_errc::invalid_argument, "coordinator: " + *no);
  shape = {.trainers = o.trainers,
           .instance_sizes = o.instance_sizes,
           .chunk_bytes = o.chunk_bytes,
           .depth = o.depth,
           .stripes = o.stripes,
           .p2p = *p2p};
  return {};
}

/// Where the coordinator listens (`o.listen`, parsed as `listen`) and with which secret.
status listen_settings(const coordinator::options& o, const api::parsed_address& listen,
                       api::link_settings& settings) {
  if (auto s = api::load_secret(listen.scheme, o.secret, o.allow_unauthenticated, settings); !s)
    return s;
  if (listen.scheme == "fabric") {
    settings.fabric_provider = listen.rest;
  } else if (listen.scheme == "inproc") {
    settings.inproc_job = listen.rest;
  } else {
    const auto colon = listen.rest.rfind(':');
    if (colon == std::string::npos)
      return failed(api_errc::invalid_argument, "listen address '" + o.listen + "': no port");
    settings.bind_host = listen.rest.substr(0, colon);
    try {
      settings.port = static_cast<std::uint16_t>(std::stoul(listen.rest.substr(colon + 1)));
    } catch (const std::exception&) {
      return failed(api_errc::invalid_argument, "listen address '" + o.listen + "': bad port");
    }
  }
  return {};
}

}  // namespace

status coordinator::open(options o) {
  std::string why;
  auto listen = api::parse_address(o.listen, why);
  if (!listen) return failed(api_errc::invalid_argument, why);
  job_shape shape;
  if (auto s = shape_of(o, shape); !s) return s;
  api::link_settings settings;
  if (auto s = listen_settings(o, *listen, settings); !s) return s;
  auto* self = impl_.get();
  const auto scheme = listen->scheme;
  const auto provider = settings.fabric_provider;
  const auto inproc_job = settings.inproc_job;
  return self->thread.start(
      scheme, coordinator_node, std::move(settings),
      [self, shape, scheme, provider, inproc_job](node& host) -> status {
        self->actor = std::make_unique<job_coordinator>(host, job_actor, shape);
        self->actor->on_delivered = [self](const version_report& r) {
          std::lock_guard lock(self->mutex);
          self->delivered = std::max(self->delivered, r.version);
          self->changed.notify_all();
        };
        self->actor->on_failed = [self](const std::string& reason) {
          std::lock_guard lock(self->mutex);
          self->failure = reason;
          self->changed.notify_all();
        };
        self->actor->start();
        self->address = scheme == "inproc"
                            ? "inproc://" + inproc_job
                            : scheme + "://" + (scheme == "fabric" ? provider + "/" : "") +
                                  host.transport().local_address();
        return {};
      },
      [self](node& host) {
        if (!self->actor) return;
        self->actor->stop_job();
        drain(host, std::chrono::milliseconds(200));
        self->actor.reset();
      });
}

coordinator::~coordinator() {
  close();
}

std::string coordinator::address() const {
  return impl_->address;
}

std::uint64_t coordinator::delivered() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->delivered;
}

std::uint64_t coordinator::next_version() const {
  std::uint64_t next = 1;
  impl_->thread.call([&] {
    if (impl_->actor) next = impl_->actor->next_version();
    return status{};
  });
  return next;
}

status coordinator::wait_delivered(std::uint64_t version, std::chrono::milliseconds timeout) const {
  auto* s = impl_.get();
  return wait_for(
      s->mutex, s->changed, timeout,
      [&] { return s->delivered >= version || s->failure || s->closed; },
      [&]() -> status {
        if (s->delivered >= version) return {};
        if (s->failure) return failed(api_errc::job_failed, *s->failure);
        return failed(api_errc::closed, "coordinator closed");
      },
      fmt::format("coordinator: waiting for version {}", version));
}

void coordinator::close() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->closed = true;
    impl_->changed.notify_all();
  }
  impl_->thread.stop();
}

}  // namespace ferry
