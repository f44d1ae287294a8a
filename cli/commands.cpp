#include "cli/commands.hpp"

namespace ferry::cli {

command_table add_commands(CLI::App& app) {
  command_table commands;
  add_demo(app, commands);
  add_jobs(app, commands);
  add_chaos(app, commands);
  add_bench(app, commands);
  add_sim(app, commands);
  return commands;
}

int run_selected(CLI::App& app, const command_table& commands) {
  for (const auto* sub : app.get_subcommands()) {
    if (auto it = commands.find(sub); it != commands.end()) return it->second();
  }
  return commands.at(nullptr)();
}

}  // namespace ferry::cli
