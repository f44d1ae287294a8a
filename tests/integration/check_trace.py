#!/usr/bin/python3
"""Runs a ferry command with `--trace FILE` and checks the merged Chrome trace it leaves: every
surviving process's track is there (a `process_name` per node id), each chunk stage is a complete
event with its version, chunk and bytes, and the trainers' offloads and the workers' applies of
every version appear (under chaos a worker that applied a version may be killed before it writes
its part: there the applies of the last version only).

Usage: check_trace.py MIN_NODES VERSIONS [--chaos] -- FERRY_BINARY COMMAND ARGS...
"""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile

min_nodes, versions = int(sys.argv[1]), int(sys.argv[2])
chaos = "--chaos" in sys.argv[: sys.argv.index("--")]
command = sys.argv[sys.argv.index("--") + 1:]
work = tempfile.mkdtemp(prefix="ferry-trace-")
atexit.register(shutil.rmtree, work, ignore_errors=True)
path = os.path.join(work, "trace.json")
env = dict(os.environ, IPATH_NO_BACKTRACE="1", FI_TCP_IFACE="lo")
run = subprocess.run([*command, "--trace", path], env=env, capture_output=True, text=True, timeout=600)
problems = []
if run.returncode != 0:
    problems.append(f"exit {run.returncode}: {run.stderr.strip()[-500:]}")
try:
    events = json.load(open(path))["traceEvents"]
except (OSError, ValueError, KeyError) as e:
    print(f"FAILED: no readable trace at {path}: {e}")
    sys.exit(1)

nodes = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
if len(nodes) < min_nodes:
    problems.append(f"{len(nodes)} node tracks, expected at least {min_nodes}")
stages = [e for e in events if e.get("ph") == "X"]
for e in stages:
    args = e.get("args", {})
    if e.get("dur", -1) < 0 or "ts" not in e or not {"version", "chunk", "bytes"} <= args.keys():
        problems.append(f"malformed stage event: {e}")
        break
for stage in ("offload", "apply"):
    seen = {e["args"]["version"] for e in stages if e.get("cat") == stage}
    wanted = {versions} if chaos and stage == "apply" else set(range(1, versions + 1))
    missing = wanted - seen
    if missing:
        problems.append(f"no '{stage}' event for version(s) {sorted(missing)}")

if problems:
    print("FAILED:\n  " + "\n  ".join(problems))
    sys.exit(1)
print(f"ok: {len(nodes)} node tracks, {len(stages)} stage events, versions 1-{versions} offloaded and applied")
