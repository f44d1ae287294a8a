#!/usr/bin/env python3
"""Runs `ferry bench` on a tiny model and checks its CSV: exit 0, the sanity verdict printed, the
expected header, and one well-formed row per (transport, chunk, depth). The numbers are not judged:
timing belongs in the results, not in a pass/fail test."""
import csv
import os
import subprocess
import sys
import tempfile

HEADER = ("transport,model_bytes,trainers,instances,workers,chunk_bytes,depth,versions_measured,median_seconds,"
          "gbps,ref_depth,speedup_vs_ref,offload_alone_s,send_alone_s,broadcast_alone_s,apply_alone_s,bound_stage,"
          "bound_seconds,whole_over_bound,whole_over_sum,busy_offload_s,busy_send_s,busy_broadcast_s,busy_apply_s,"
          "stall_s,load1").split(",")
STAGES = {"offload", "send", "broadcast", "apply"}

ferry = sys.argv[1]
transports = sys.argv[2].split(",") if len(sys.argv) > 2 else ["inproc", "tcp"]
with tempfile.TemporaryDirectory() as scratch:
    path = os.path.join(scratch, "bench.csv")
    command = [ferry, "bench", "--transports", ",".join(transports), "--depths", "2", "--chunk-bytes", "1MiB",
               "--model-bytes", "8MiB", "--trainers", "2", "--instances", "1", "--workers", "2", "--versions", "3",
               "--stage-repeats", "1", "--csv", path]
    run = subprocess.run(command, capture_output=True, text=True, timeout=170)
    failures = []
    if run.returncode != 0:
        failures.append(f"exit code {run.returncode}")
    for t in transports:
        if f"sanity {t}: " not in run.stdout or "verified" not in run.stdout:
            failures.append(f"no verified sanity line for {t}")
    rows = []
    if not os.path.exists(path):
        failures.append("no CSV written")
    else:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, [])
            if header != HEADER:
                failures.append(f"header {header} != {HEADER}")
            rows = [dict(zip(header, r)) for r in reader]
        if [r["transport"] for r in rows] != transports:
            failures.append(f"rows for {[r['transport'] for r in rows]}, expected one each for {transports}")
        for r in rows:
            if len(r) != len(HEADER):
                failures.append(f"row with {len(r)} fields: {r}")
                continue
            if (r["chunk_bytes"], r["depth"], r["model_bytes"], r["versions_measured"]) != ("1048576", "2", "8388608", "2"):
                failures.append(f"row does not describe the point asked for: {r}")
            if r["bound_stage"] not in STAGES:
                failures.append(f"bound_stage {r['bound_stage']!r} is no stage")
            for key in HEADER:
                if key not in ("transport", "bound_stage"):
                    try:
                        if float(r[key]) < 0:
                            failures.append(f"{key} is negative: {r[key]}")
                    except ValueError:
                        failures.append(f"{key} is not a number: {r[key]!r}")
            if float(r["median_seconds"]) <= 0 or float(r["bound_seconds"]) <= 0:
                failures.append(f"a time of zero: {r}")

if failures:
    print("FAILED:", "; ".join(failures))
    print("--- stdout ---\n" + run.stdout + "\n--- stderr (tail) ---\n" + run.stderr[-6000:])
    sys.exit(1)
print(f"ok: {len(rows)} rows, header and sanity verdicts as expected")
