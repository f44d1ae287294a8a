#pragma once
/// The loop thread behind each public object: an event loop, the real environment, one node on
/// its transport, all built and run on a thread of its own, and calls posted to it from any
/// thread.
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "api/member_gpu.hpp"
#include "ferry/ferry.hpp"
#include "platform/real_environment.hpp"
#include "runtime/event_loop.hpp"
#include "runtime/node.hpp"
#include "transport/factory.hpp"

namespace ferry::api {

/// `status` from an api_errc and a message.
status failed(api_errc e, std::string message);

/// A transport address split: "tcp://127.0.0.1:4000" -> {"tcp", "127.0.0.1:4000"}.
struct parsed_address {
  std::string scheme;
  std::string rest;
};
std::optional<parsed_address> parse_address(const std::string& address, std::string& why);

/// The inproc network of `name`, shared by this process's objects while any of them holds it.
std::shared_ptr<inproc_network> inproc_job_network(const std::string& name);

/// How a member's transport is opened (transport_settings, which cannot be copied to the thread).
struct link_settings {
  std::vector<std::byte> secret;  ///< empty: unauthenticated
  bool allow_unauthenticated = false;
  std::string bind_host = "127.0.0.1";
  std::uint16_t port = 0;
  std::string fabric_provider;
  std::string inproc_job;  ///< inproc://NAME: the process-wide network of that name
};

/// The job secret into `out`: `given`, else FERRY_SECRET_FILE / FERRY_SECRET; refused when
/// missing unless unauthenticated links are allowed, or `scheme` is inproc (one process's objects
/// need none among themselves).
status load_secret(const std::string& scheme, const std::string& given, bool allow_unauthenticated,
                   link_settings& out);

class member_thread {
 public:
  member_thread() = default;
  ~member_thread() { stop(); }
  member_thread(const member_thread&) = delete;
  member_thread& operator=(const member_thread&) = delete;

  /// Starts the thread and opens the node there (`scheme` transport, id `self`; with `device`,
  /// that GPU: `gpu()`); then runs `setup` on it (it builds the actors). Once the loop stopped,
  /// `teardown` runs there before the node goes (it unwinds the actors). Returns what opening
  /// and `setup` said.
  status start(const std::string& scheme, node_id self, link_settings settings,
               std::function<status(node&)> setup, std::function<void(node&)> teardown,
               int device = -1);
  /// Loop thread: the GPU `start` opened, or null.
  member_gpu* gpu() const { return gpu_; }
  /// Runs `fn` on the loop thread and waits for it; refused once stopped.
  status call(std::function<status()> fn);
  /// Runs `fn` on the loop thread without waiting.
  void post(std::function<void()> fn);
  /// Runs `before_stop` on the loop, then ends the loop and joins the thread (idempotent).
  void stop(std::function<void()> before_stop = {});
  bool running() const { return loop_ != nullptr; }

 private:
  void run(const std::string& scheme, node_id self, const link_settings& settings,
           std::function<status(node&)> setup, std::function<void(node&)> teardown, int device,
           std::promise<status>& opened);

  std::thread thread_;
  event_loop* loop_ = nullptr;  ///< lives on the thread; set while it runs
  std::mutex mutex_;            ///< guards loop_ against stop
  bool stopping_ = false;       ///< loop thread only
  member_gpu* gpu_ = nullptr;   ///< loop thread only
};

}  // namespace ferry::api
