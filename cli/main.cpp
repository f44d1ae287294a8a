/// The `ferry` command line: demo (the default), and the pieces of multi-process jobs.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <iostream>

#include "cli/commands.hpp"
#include "cli/interrupt.hpp"

int main(int argc, char** argv) {
  // Every command stops on SIGINT and SIGTERM through `interrupt_token`, and exits 128 + it.
  ferry::cli::watch_interrupts();
  CLI::App app{"ferry: moves freshly trained weights from trainers to rollout workers"};
  app.require_subcommand(0, 1);
  auto commands = ferry::cli::add_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "ferry: %s\n", e.what());
    return 2;
  }
  try {
    return ferry::cli::run_selected(app, commands);
  } catch (const std::exception& e) {
    // A bug, never the user's input: one line and a failure, not an abort (children die with us).
    std::fprintf(stderr, "ferry: internal error: %s\n", e.what());
    return 1;
  }
}
