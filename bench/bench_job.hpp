#pragma once
/// The job that ferry_api_bench and ferry_internal_bench both run, as flags: defined once, so that
/// bench/api_overhead.py compares one update through two paths.
#include <CLI/CLI.hpp>
#include <cstdint>

struct bench_job {
  std::uint64_t model_bytes = 256ull << 20, chunk_bytes = 4ull << 20;
  std::uint32_t tensors = 64, depth = 2, workers = 2, versions = 9;
  bool checks = false;

  void add_flags(CLI::App& app) {
    app.add_option("--model-bytes", model_bytes);
    app.add_option("--tensors", tensors)->check(CLI::Range(1u, 100000u));
    app.add_option("--chunk-bytes", chunk_bytes);
    app.add_option("--depth", depth);
    app.add_option("--workers", workers)->check(CLI::Range(1u, 64u));
    app.add_option("--versions", versions)->check(CLI::Range(1u, 10000u));
    app.add_flag("--checks", checks, "xxh3 chunk checksums and tensor digests on");
  }
};
