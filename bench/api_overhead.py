#!/usr/bin/python3
"""What the public API costs per update: the same job through the C++ API (ferry_api_bench, over
libferry.so) and with the actors driven directly (ferry_internal_bench), in alternating rounds on
one machine. Each run's figure is the median of versions 2..N of publish -> every rollout holds
the version; the ratio is API / internal, per round and over the rounds' medians.

Usage: api_overhead.py BUILD_DIR [--rounds R] [--versions N] [--model-bytes B] [--workers W] [--checks]
Prints a markdown table; exits 1 when a run fails.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys


def run(binary, args):
    flags = ["--versions", str(args.versions), "--model-bytes", str(args.model_bytes), "--workers", str(args.workers),
             "--tensors", str(args.tensors), "--chunk-bytes", str(args.chunk_bytes)]
    if args.checks:
        flags.append("--checks")
    done = subprocess.run([binary, *flags], capture_output=True, text=True, env=dict(os.environ, FERRY_LOG="error"))
    if done.returncode != 0:
        sys.exit(f"{binary} failed ({done.returncode}): {done.stderr[-2000:]}")
    times = json.loads(done.stdout.strip().splitlines()[-1])["per_version_s"]
    return statistics.median(times[1:])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--versions", type=int, default=12)
    parser.add_argument("--model-bytes", type=int, default=256 << 20)
    parser.add_argument("--tensors", type=int, default=64)
    parser.add_argument("--chunk-bytes", type=int, default=4 << 20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checks", action="store_true")
    args = parser.parse_args()
    binaries = {"internal": os.path.join(args.build, "bench", "ferry_internal_bench"),
                "api": os.path.join(args.build, "bench", "ferry_api_bench")}
    rows = []
    for r in range(args.rounds):
        # Alternate which goes first, so that neither always runs on a warmer machine.
        order = ["internal", "api"] if r % 2 == 0 else ["api", "internal"]
        got = {name: run(binaries[name], args) for name in order}
        rows.append(got)
        print(f"round {r + 1}: internal {got['internal']:.4f} s, api {got['api']:.4f} s, "
              f"x{got['api'] / got['internal']:.3f}", file=sys.stderr, flush=True)
    internal = statistics.median(r["internal"] for r in rows)
    api = statistics.median(r["api"] for r in rows)
    ratios = [r["api"] / r["internal"] for r in rows]
    print(f"{args.model_bytes >> 20} MiB in {args.tensors} tensors, {args.chunk_bytes >> 20} MiB chunks, 1 trainer -> "
          f"{args.workers} rollouts, tcp loopback, checks {'on' if args.checks else 'off'}; "
          f"{os.cpu_count()} cores, {platform.machine()}\n")
    print("| round | internal s | API s | API / internal |")
    print("| --- | --- | --- | --- |")
    for i, r in enumerate(rows):
        print(f"| {i + 1} | {r['internal']:.4f} | {r['api']:.4f} | {ratios[i]:.3f} |")
    print(f"| median | {internal:.4f} | {api:.4f} | **{api / internal:.3f}** |")
    print(f"\nper-round ratios: median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
