#pragma once
/// The subcommands of `ferry`.
#include <CLI/CLI.hpp>
#include <functional>
#include <map>

namespace ferry::cli {

/// Each subcommand's action, keyed by the subcommand; the null key is the default (`demo`).
using command_table = std::map<const CLI::App*, std::function<int()>>;

command_table add_commands(CLI::App& app);
/// Runs the parsed subcommand (or the demo); returns the process exit code.
int run_selected(CLI::App& app, const command_table& commands);

void add_demo(CLI::App& app, command_table& commands);
void add_jobs(CLI::App& app, command_table& commands);
void add_chaos(CLI::App& app, command_table& commands);
void add_bench(CLI::App& app, command_table& commands);
void add_sim(CLI::App& app, command_table& commands);

}  // namespace ferry::cli
