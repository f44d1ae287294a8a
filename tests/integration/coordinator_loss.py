#!/usr/bin/env python3
"""A job whose coordinator process is SIGKILLed mid-job: every node notices the lost link and
exits on its own (non-zero, saying why) within a bound, instead of waiting for its --timeout.
Usage: coordinator_loss.py FERRY"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from job_processes import start_coordinator

ferry = sys.argv[1]
BOUND_S = 10
job = ["--trainers", "1", "--instances", "1", "--workers", "2", "--model-bytes", "16MiB", "--chunk-bytes", "1MiB",
       "--versions", "100000", "--transport", "tcp", "--timeout", "300"]
with tempfile.TemporaryDirectory() as scratch:
    coordinator, address, env = start_coordinator(ferry, job, scratch, stderr=subprocess.DEVNULL)
    roles = [["--role", "trainer", "--shard", "0"], ["--role", "worker", "--instance", "0", "--rank", "0"],
             ["--role", "worker", "--instance", "0", "--rank", "1"]]
    logs = [os.path.join(scratch, f"node{i + 1}.log") for i in range(len(roles))]
    nodes = [subprocess.Popen([ferry, "node", *job, "--coordinator", address, "--node-id", str(i + 1), *role],
                              stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
             for i, (role, log) in enumerate(zip(roles, logs))]
    delivered = 0
    for line in coordinator.stdout:  # wait until the job is in full swing
        if json.loads(line).get("event") == "delivered":
            delivered += 1
            if delivered == 3:
                break
    coordinator.send_signal(signal.SIGKILL)
    coordinator.wait()
    killed_at = time.time()
    failures = []
    for i, p in enumerate(nodes):
        try:
            p.wait(timeout=max(0.1, killed_at + BOUND_S - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            failures.append(f"node {i + 1} still ran {BOUND_S} s after the coordinator was killed")
            continue
        text = open(logs[i]).read()
        if p.returncode == 0:
            failures.append(f"node {i + 1} exited 0 without its coordinator")
        if "lost the coordinator" not in text:
            failures.append(f"node {i + 1} did not say it lost the coordinator:\n{text[-1500:]}")
    if delivered < 3:
        failures.append(f"only {delivered} versions delivered before the kill")
    print(f"{delivered} versions delivered; coordinator killed; nodes exited with "
          f"{[p.returncode for p in nodes]} within {time.time() - killed_at:.1f} s")
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)
