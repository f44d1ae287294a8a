#!/usr/bin/env python3
"""Runs a ferry job command and checks its JSON verdict: exit 0, verified, the expected workers,
every version delivered with matching digests. Prints the command's output on failure."""
import argparse

from job_verdict import exit_on_failures, run_job

parser = argparse.ArgumentParser()
parser.add_argument("--workers", type=int, required=True)
parser.add_argument("--device-direct", action="store_true", help="every trainer-worker pair reads GPU to GPU")
parser.add_argument("command", nargs=argparse.REMAINDER)
args = parser.parse_args()
command = args.command[1:] if args.command and args.command[0] == "--" else args.command
versions = int(command[command.index("--versions") + 1])

run, verdict, failures = run_job(command, timeout=170)
if verdict:
    if verdict.get("workers") != args.workers:
        failures.append(f"workers {verdict.get('workers')} != {args.workers}")
    per_version = verdict.get("per_version", [])
    if [v["version"] for v in per_version] != list(range(1, versions + 1)):
        failures.append(f"versions delivered out of order or missing: {per_version}")
    if not all(v["verified"] for v in per_version):
        failures.append("a version's digests differ on some worker")
    if args.device_direct and not 0 < verdict.get("device_direct_pairs", 0) == verdict.get("pairs"):
        failures.append(f"{verdict.get('device_direct_pairs')} of {verdict.get('pairs')} trainer-worker pairs GPU to GPU")
    if verdict.get("bytes") != verdict.get("model_bytes", 0) * versions or verdict.get("bytes", 0) <= 0:
        failures.append(f"bytes {verdict.get('bytes')} inconsistent with model_bytes and versions")

exit_on_failures(failures, run, stderr_tail=6000)
print(f"ok: {versions} versions of {verdict['model_bytes']} bytes to {verdict['workers']} workers, "
      f"digests match ({verdict['gbps']:.2f} GB/s)")
