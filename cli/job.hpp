#pragma once
/// What the processes of a multi-process job share: their flags, and the command line that
/// starts one of them (for the launchers `ferry local` and `ferry chaos`).
#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/options.hpp"
#include "runtime/message.hpp"
#include "transport/factory.hpp"

namespace ferry::cli {

/// Flags every process of a multi-process job shares.
struct process_flags {
  job_config job;
  std::string coordinator_address;
  std::string address_file;
  bool allow_unauthenticated = false;
  double timeout_seconds = 600;
  bool json = false;
  bool events = false;
  std::string fabric_provider;
  std::string bind_host = "127.0.0.1";  ///< the local address this process listens and connects on
  std::string model = "synthetic";      ///< or "llama3-8b" (then --model-bytes is ignored)
  bool gpus = false;                    ///< local: one GPU per node process, in start order
  /// local: the GPU of each GPU node process in start order (trainers, then workers); several may
  /// share one. Implies `gpus`.
  std::vector<int> gpu_list;
  bool host_trainers = false;       ///< local with gpus: trainer shards keep host memory
  double heartbeat_timeout_s = 10;  ///< coordinator: a member silent this long is dead
};

void add_process_flags(CLI::App& app, process_flags& f);

/// Flags of `ferry node`: one trainer shard or rollout worker of a multi-process job.
struct node_flags {
  process_flags common;
  std::string role;
  node_id id = 1;
  std::uint32_t shard = 0, instance = 0, rank = 0;
  int device = -1;  ///< the GPU this process's tensors live on; -1: host memory
};

/// The transport settings of a job process, or what is wrong with its flags; the job secret comes
/// from the environment only.
std::optional<std::string> prepare_environment(const process_flags& f, transport_settings& env);

/// `ferry node`; returns the exit code.
int run_node(const node_flags& f);

/// The command line of `ferry <command>` for a process of job `j`; `self` is this executable.
std::vector<std::string> job_args(const std::string& self, const std::string& command,
                                  const job_config& j);

/// `ferry local`: a coordinator and one node process per trainer shard and rollout worker on
/// this host (with `gpus`, one GPU per node in start order); returns the exit code.
int run_local(const process_flags& f);

/// `args` plus the flags every process of a launched job shares.
std::vector<std::string> with_process_flags(const process_flags& f, std::vector<std::string> args);

}  // namespace ferry::cli
