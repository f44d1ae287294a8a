#!/usr/bin/env python3
"""Membership changes of a real job (processes over tcp on loopback):
- after version 1, a worker gets SIGTERM: it leaves (the job regroups, "left: SIGTERM") and exits 143,
  and a new worker joins in its place and catches up;
- a trainer shard's process is SIGKILLed while version 2 is in flight: the update fails on every
  participant within a bound (no worker completes it). The process is stopped (SIGSTOP) when
  version 1 is delivered, so version 2 cannot complete before the kill, however loaded the host;
- a new process of that shard joins: the job publishes again and ends verified. It is started only
  once the new worker has joined (the coordinator says so on stderr): the job cannot publish
  without that shard, so the join cannot lose a race with the job's end on a slow host.
Usage: membership.py FERRY [JOB FLAGS...] (e.g. --shared-host-copies)"""
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import time

from job_processes import exit_failed, line_reader, start_coordinator

ferry = sys.argv[1]
BOUND_S = 15  # from the kill to update_failed; the link drop is seen at once, heartbeats in 10 s
job = ["--trainers", "2", "--instances", "1", "--workers", "2", "--model-bytes", "64MiB", "--chunk-bytes", "1MiB",
       "--depth", "2", "--versions", "4", "--transport", "tcp", "--timeout", "120", *sys.argv[2:]]
failures = []
with tempfile.TemporaryDirectory() as scratch:
    # Appending: the coordinator shares this file's offset, which each read here moves.
    coordinator_log = open(os.path.join(scratch, "coordinator.log"), "a+")
    coordinator, address, env = start_coordinator(ferry, job, scratch, stderr=coordinator_log)
    logs = {}

    def worker_joined():
        coordinator_log.seek(0)
        return "worker 0.2 joined (node 6)" in coordinator_log.read()

    def start(node_id, *role):
        log = open(os.path.join(scratch, f"node{node_id}.log"), "w+")
        logs[node_id] = log
        return subprocess.Popen([ferry, "node", *job, "--coordinator", address, "--node-id", str(node_id), *role],
                                stdout=log, stderr=log, env=env)

    trainers = {0: start(1, "--role", "trainer", "--shard", "0"), 1: start(2, "--role", "trainer", "--shard", "1")}
    workers = [start(3, "--role", "worker", "--instance", "0", "--rank", "0"),
               start(4, "--role", "worker", "--instance", "0", "--rank", "1")]
    events, verdict, killed_at, failed_version, rejoined = [], None, None, None, False
    lines = line_reader(coordinator.stdout)
    end = time.time() + 150
    while time.time() < end and verdict is None:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            line = ""
        if failed_version is not None and not rejoined and worker_joined():
            trainers[1] = start(5, "--role", "trainer", "--shard", "1")  # the shard rejoins
            rejoined = True
        if line is None:
            break
        if not line:
            continue
        e = json.loads(line)
        if "event" not in e:
            verdict = e
            break
        events.append(e)
        if e["event"] == "delivered" and e["version"] == 1 and 6 not in logs:
            trainers[1].send_signal(signal.SIGSTOP)  # frozen before it can send all of version 2
            workers[1].send_signal(signal.SIGTERM)
            workers.append(start(6, "--role", "worker", "--instance", "0", "--rank", "2"))
        if e["event"] == "update" and e["version"] == 2 and killed_at is None:
            trainers[1].send_signal(signal.SIGKILL)
            trainers[1].wait()
            killed_at = time.time()
        if e["event"] == "update_failed" and failed_version is None:
            failed_version = e["version"]
            if time.time() - killed_at > BOUND_S:
                failures.append(f"update_failed came {time.time() - killed_at:.1f} s after the kill (bound {BOUND_S} s)")
    coordinator.wait(timeout=30)
    for p in [trainers[0], trainers[1], *workers]:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
    if workers[1].returncode != 128 + signal.SIGTERM:
        failures.append(f"the worker that got SIGTERM exited {workers[1].returncode}, not 143")
    regroups = " ".join(e.get("reason", "") for e in events if e["event"] == "regroup")
    if "worker 0.1 (node 4) left: SIGTERM" not in regroups or "worker 0.2 joined (node 6)" not in regroups:
        failures.append(f"no regroup for the leave and the join: {regroups}")
    if killed_at is None:
        failures.append("no update of version 2 was seen: nothing was killed")
    if failed_version != 2:
        failures.append(f"expected update_failed for version 2, got {failed_version}")
    delivered = [e["version"] for e in events if e["event"] == "delivered"]
    if 2 in delivered:
        failures.append("version 2 was delivered although its trainer died mid-update")
    if not verdict or verdict.get("verified") is not True:
        failures.append(f"the job did not end verified: {verdict}")
    if not delivered or max(delivered) <= 2:
        failures.append(f"nothing was published after the shard rejoined: delivered {delivered}")
    # A clear error on every participant: the surviving trainer and the worker there all along say so.
    for node_id in (1, 3):
        logs[node_id].seek(0)
        text = logs[node_id].read()
        if "version 2 failed" not in text:
            failures.append(f"node {node_id} logged no failure of version 2")
    if failures:
        exit_failed(failures, events, verdict, logs, coordinator_log)
    print(f"ok: a worker left on SIGTERM and another joined; version 2 failed on every participant after its trainer was killed; "
          f"delivered {delivered} after the shard rejoined, verified")
