/// `ferry node`: one trainer shard or rollout worker of a multi-process job, a program that embeds
/// ferry through its public API as a trainer or an inference engine would.
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <stop_token>

#include "actors/rollout_sharding.hpp"
#include "actors/synthetic_model.hpp"
#include "cli/gpu.hpp"
#include "cli/interrupt.hpp"
#include "cli/job.hpp"
#include "ferry/ferry.hpp"
#include "runtime/host_buffer.hpp"
#include "runtime/log.hpp"

namespace ferry::cli {
namespace {

/// The coordinator's address as the public API names it: the transport's scheme, then its address.
std::string coordinator_uri(const process_flags& f) {
  if (f.job.transport == "fabric")
    return "fabric://" + f.fabric_provider + "/" + f.coordinator_address;
  return f.job.transport + "://" + f.coordinator_address;
}

/// `t` as the public API takes it.
ferry::tensor api_tensor(const tensor_ref& t) {
  return {.name = t.spec.name,
          .dtype = std::string(dtype_name(t.spec.type)),
          .shape = {t.spec.shape.begin(), t.spec.shape.end()},
          .data = t.data,
          .device = t.device};
}

/// Registers what a worker holds: whole tensors, or a row range (tensor-parallel sharding).
ferry::status register_share(ferry::rollout& rollout, const tensor_ref& t) {
  const auto held = t.held();
  if (held.bytes == t.spec.nbytes || t.spec.shape.empty())
    return rollout.register_tensor(api_tensor(t));
  const auto row_bytes = t.spec.nbytes / static_cast<std::uint64_t>(t.spec.shape[0]);
  return rollout.register_rows(api_tensor(t), static_cast<std::int64_t>(held.offset / row_bytes),
                               static_cast<std::int64_t>(held.bytes / row_bytes));
}

int usage_error(const std::string& what) {
  std::fprintf(stderr, "ferry node: %s\n", what.c_str());
  return 2;
}

/// What keeps the node from starting that is no usage error (device memory).
int start_error(const std::string& what) {
  std::fprintf(stderr, "ferry node: %s\n", what.c_str());
  return 1;
}

/// One `ferry node` run: it registers the synthetic model's tensors (host memory, or its GPU's)
/// and publishes versions of them, or receives them, until the coordinator ends the job. SIGINT
/// or SIGTERM: it leaves the job (closing the member), which regroups without it, rather than
/// vanish; then exits 128 + the signal. Every wait is cut in short slices for that.
class api_node {
 public:
  explicit api_node(const node_flags& f) : f_(f), job_(f.common.job) {}

  int run() {
    transport_settings env;
    if (auto error = prepare_environment(f_.common, env)) return usage_error(*error);
    // The secret prepare_environment read and checked, passed on rather than read again.
    member_ = {
        .coordinator = coordinator_uri(f_.common),
        .secret = std::string(reinterpret_cast<const char*>(env.secret.data()), env.secret.size()),
        .allow_unauthenticated = f_.common.allow_unauthenticated,
        .node_id = f_.id,
        .checksums = job_.checksums,
        .digests = job_.verify,
        .listen_host = f_.common.bind_host,
        .trace_file = job_.trace_path};
    if (f_.device >= 0) {
      if (f_.device >= visible_gpus())
        return usage_error(
            fmt::format("--device {}: this host has {} CUDA devices", f_.device, visible_gpus()));
      on_gpu_ = std::make_unique<device_tensors>(f_.device);
    }
    std::stop_callback on_interrupt(interrupt_token(), [this] { interrupted_ = true; });
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(f_.common.timeout_seconds));
    const auto model =
        f_.common.model == "llama3-8b" ? llama3_8b() : synthetic_transformer(job_.model_bytes);
    if (auto early = f_.role == "trainer" ? trainer(model) : rollout(model)) return *early;
    if (interrupted_) return interrupted_exit_code();  // the member left as it closed
    if (failure_) log::error("node {}: {}", f_.id, *failure_);
    log::set_level(log::level::error);  // peers leaving after the job's end is the plan, not news
    return failure_ ? 1 : 0;
  }

 private:
  /// The trainer's "training loop": produce version v, publish it, and once it is delivered the
  /// next; until --versions are delivered (a failed version is skipped, not retried: one more is
  /// published in its place) or the coordinator ends the job. An exit code when it cannot begin.
  std::optional<int> trainer(const std::vector<tensor_spec>& model) {
    const auto shards = split_over_shards(model, job_.trainers);
    if (f_.shard >= shards.size())
      return usage_error(fmt::format("--shard {}: the job has {}", f_.shard, job_.trainers));
    std::vector<host_buffer> storage;  // the tensors, or on a GPU the host bytes uploaded into them
    std::vector<tensor_ref> tensors;
    for (const auto& s : shards[f_.shard]) {
      storage.emplace_back(s.nbytes);
      tensors.push_back({.spec = s, .data = storage.back().data()});
    }
    std::string why;
    if (on_gpu_ && (tensors = on_gpu_->allocate(tensors, why)).empty()) return start_error(why);
    ferry::trainer trainer({member_, f_.shard});
    for (const auto& t : tensors) {
      if (auto s = trainer.register_tensor(api_tensor(t)); !s) return usage_error(s.message);
    }
    if (auto usage = joined(trainer.join())) return usage;
    if (!failure_) {
      if (auto ready = await([&](auto slice) { return trainer.wait_ready(slice); });
          ready && !*ready)
        failure_ = ready->message;
    }
    std::uint64_t version = 0;
    for (std::uint32_t delivered = 0; !failure_ && !interrupted_ && delivered < job_.versions;) {
      version = std::max(version + 1, trainer.next_version());
      for (std::size_t i = 0; i < tensors.size(); ++i)
        fill_version(storage[i].span(), tensors[i].spec.name, version);
      if (on_gpu_) {
        (void)select_device(f_.device);
        for (std::size_t i = 0; i < tensors.size() && !failure_; ++i) {
          if (auto ec = copy_blocking(tensors[i].data, storage[i].data(), tensors[i].spec.nbytes))
            failure_ = "upload of '" + tensors[i].spec.name + "' failed: " + ec.message();
        }
        if (failure_) break;
      }
      ferry::trainer::update update(nullptr);
      if (auto s = trainer.publish(version, &update); !s) {
        if (s.code != ferry::api_errc::closed) failure_ = "publish refused: " + s.message;
        break;
      }
      const auto s = await([&](auto slice) { return update.wait_delivered(slice); });
      if (!s || s->code == ferry::api_errc::closed)
        break;  // interrupted, timed out, or the job ended
      if (s->code == ferry::api_errc::update_failed) {
        const auto prefix =
            fmt::format("version {}: ", version);  // the API's message names the version
        const auto reason =
            s->message.starts_with(prefix) ? s->message.substr(prefix.size()) : s->message;
        log::warn("trainer shard {}: version {} failed: {}; publishing again once the job regroups",
                  f_.shard, version, reason);
        continue;  // `publish` waits for the regrouped job
      }
      if (!*s)
        failure_ = s->message;
      else
        ++delivered;
    }
    if (!failure_ && !interrupted_) until_the_end(trainer);
    if (interrupted_) trainer.close(interrupt_name());
    return std::nullopt;
  }

  /// A rollout worker: its share of the model (a replacement, a rank past the instance size,
  /// holds the share of rank % size) until the job ends; on a GPU, every byte checked at the end.
  std::optional<int> rollout(const std::vector<tensor_spec>& model) {
    auto destinations = rollout_share(
        model, job_.shard_rollout, f_.rank % job_.workers_per_instance, job_.workers_per_instance);
    std::string why;
    if (on_gpu_ && (destinations = on_gpu_->allocate(destinations, why)).empty())
      return start_error(why);
    ferry::rollout rollout({member_, f_.instance, f_.rank});
    for (const auto& t : destinations) {
      if (auto s = register_share(rollout, t); !s) return usage_error(s.message);
    }
    rollout.on_version([this](std::uint64_t v) {
      log::debug("worker {}.{}: version {} applied", f_.instance, f_.rank, v);
    });
    if (auto usage = joined(rollout.join())) return usage;
    if (!failure_) until_the_end(rollout);
    if (interrupted_) rollout.close(interrupt_name());
    if (on_gpu_ && !failure_ && !interrupted_) check_gpu_bytes(rollout.version(), destinations);
    return std::nullopt;
  }

  /// Every byte of the last version on this GPU, against what the trainers published.
  void check_gpu_bytes(std::uint64_t version, const std::vector<tensor_ref>& destinations) {
    // Versions that failed take numbers too: the last of `versions` delivered is that one or later.
    if (version < job_.versions) {
      failure_ = fmt::format("holds version {} at the end, before the job's {} versions", version,
                             job_.versions);
    } else if (auto error = check_device_tensors(destinations, version); !error.empty()) {
      failure_ = "GPU bytes differ: " + error;
    } else {
      log::info("worker {}.{}: every byte of version {} verified on GPU {} ({} bytes)", f_.instance,
                f_.rank, version, f_.device, held_bytes(destinations));
    }
  }

  /// Runs `wait(slice)` until it answers, this node is interrupted (nullopt) or --timeout passes
  /// (a failure: the job is still on, or never began).
  template <class Wait>
  std::optional<ferry::status> await(Wait wait) {
    while (!interrupted_) {
      if (std::chrono::steady_clock::now() >= deadline_) {
        failure_ = fmt::format("timed out after {} s without the job's end (coordinator {})",
                               f_.common.timeout_seconds, f_.common.coordinator_address);
        return std::nullopt;
      }
      if (auto s = wait(std::chrono::milliseconds(50)); s.code != ferry::api_errc::timed_out)
        return s;
    }
    return std::nullopt;
  }

  /// The job's end: the coordinator stops it once its versions are delivered.
  template <class Member>
  void until_the_end(Member& member) {
    if (auto s = await([&](auto slice) { return member.wait_end(slice); }); s && !*s)
      failure_ = s->message;
  }

  /// A bad --coordinator is a usage error (exit 2); anything else fails the node.
  std::optional<int> joined(const ferry::status& s) {
    if (s.code == ferry::api_errc::invalid_argument) {
      return usage_error(
          fmt::format("--coordinator '{}': {}", f_.common.coordinator_address, s.message));
    }
    if (!s) failure_ = s.message;
    return std::nullopt;
  }

  const node_flags& f_;
  const job_config& job_;
  ferry::member_options member_;
  std::unique_ptr<device_tensors> on_gpu_;
  std::atomic<bool> interrupted_{false};
  std::chrono::steady_clock::time_point deadline_;
  std::optional<std::string> failure_;
};

}  // namespace

int run_node(const node_flags& f) {
  return api_node(f).run();
}

}  // namespace ferry::cli
