#!/usr/bin/env python3
"""Device-direct through deaths, on this host's GPUs: two trainer shards and two instances of one
worker (each its instance's leader), every process on a GPU (shared when fewer are visible: no
instance has two members, whose NCCL collective would need two GPUs), reading GPU to GPU.
- A trainer shard is frozen (SIGSTOP) once version 1 is delivered and SIGKILLed once the next
  update starts: that version fails, the workers drop their mapping of its device copies at the
  regroup, and a new process of the shard joins.
- A leader is frozen once a version after that is delivered and SIGKILLed once the next update
  starts, mid-copy from the trainers' device copies: the job regroups, a new worker joins and is
  caught up.
The job must end verified, every process left exiting 0 (each compares every byte on its GPU).
Usage: device_direct_faults.py FERRY"""
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from job_processes import exit_failed, line_reader, start_coordinator  # noqa: E402

ferry = sys.argv[1]
try:
    visible = sum(l.startswith("GPU ") for l in subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                                                               text=True).stdout.splitlines())
except OSError:
    visible = 0
job = ["--trainers", "2", "--instances", "2", "--workers", "1", "--model-bytes", "1GiB", "--chunk-bytes", "64MiB",
       "--depth", "2", "--versions", "6", "--transport", "cma", "--timeout", "240"]
failures = []
with tempfile.TemporaryDirectory() as scratch:
    coordinator_log = open(os.path.join(scratch, "coordinator.log"), "a+")
    coordinator, address, env = start_coordinator(ferry, job + ["--heartbeat-timeout", "30"], scratch,
                                                  stderr=coordinator_log)
    env["NCCL_NVLS_ENABLE"] = "0"
    logs, processes = {}, {}

    def start(node_id, *role):
        log = open(os.path.join(scratch, f"node{node_id}.log"), "w+")
        logs[node_id] = log
        device = ["--device", str(node_id % visible)] if visible else []  # none: the script's own logic, on host memory
        processes[node_id] = subprocess.Popen(
            [ferry, "node", *job, "--coordinator", address, "--node-id", str(node_id), *device, *role],
            stdout=log, stderr=log, env=env)

    start(1, "--role", "trainer", "--shard", "0")
    start(2, "--role", "trainer", "--shard", "1")
    start(3, "--role", "worker", "--instance", "0", "--rank", "0")
    start(4, "--role", "worker", "--instance", "1", "--rank", "0")
    events, verdict = [], None
    frozen, killed = None, []  # the node frozen now; (node, version of the update it died in)
    lines = line_reader(coordinator.stdout)
    end = time.time() + 300
    while time.time() < end and verdict is None:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            continue
        if line is None:
            break
        e = json.loads(line)
        if "event" not in e:
            verdict = e
            break
        events.append(e)
        if e["event"] == "delivered" and frozen is None:
            victim = 2 if not killed else (4 if len(killed) == 1 and 7 in processes else None)
            if victim is not None:
                processes[victim].send_signal(signal.SIGSTOP)  # it cannot finish the next update
                frozen = victim
        elif e["event"] == "update" and frozen is not None:
            processes[frozen].send_signal(signal.SIGKILL)
            processes[frozen].wait()
            killed.append((frozen, e["version"]))
            if frozen == 2:
                start(7, "--role", "trainer", "--shard", "1")
            else:
                start(8, "--role", "worker", "--instance", "1", "--rank", "0")
            frozen = None
    coordinator.wait(timeout=60)
    for node_id, p in processes.items():
        if node_id in (2, 4):
            continue
        try:
            p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            failures.append(f"node {node_id} did not exit")
        if p.returncode != 0:
            failures.append(f"node {node_id} exited {p.returncode}")
    if [k[0] for k in killed] != [2, 4]:
        failures.append(f"expected the trainer (node 2), then the leader (node 4) killed mid-update: {killed}")
    failed = [x["version"] for x in events if x["event"] == "update_failed"]
    if killed and killed[0][1] not in failed:
        failures.append(f"version {killed[0][1]} did not fail although its trainer died mid-update: failed {failed}")
    if not verdict or verdict.get("verified") is not True:
        failures.append(f"the job did not end verified: {verdict}")
    if not verdict or verdict.get("device_direct_pairs", 0) == 0:
        failures.append("no trainer-worker pair read GPU to GPU")
    if 8 in logs:
        logs[8].seek(0)
        if "reads the device copies of trainer process" not in logs[8].read():
            failures.append("the replacement worker never read a trainer's device copies")
    if failures:
        exit_failed(failures, events, verdict, logs, coordinator_log)
    print(f"ok: killed {killed} mid-update; failed {failed}; delivered "
          f"{[x['version'] for x in events if x['event'] == 'delivered']}, verified, GPU to GPU")
