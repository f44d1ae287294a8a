#!/usr/bin/python3
"""A real job forms and completes while outside clients hold a flood of idle connections to its
coordinator (issue 15, finding 2).

`ferry coordinator` starts; a client process (idle_flood.py) opens FLOOD idle TCP connections to it
from one address (127.0.0.2), or spread over several (127.0.0.2-9), never sends a byte, and opens a
new one for each the coordinator drops; then the trainers and workers (`ferry node`, 127.0.0.1)
start and must join, and every version must be delivered and verified while the flood goes on.
The coordinator's log must stay bounded: connections turned away before their handshake are summed
up at most once a second, never logged one by one.

Usage: flood_job.py FERRY_BINARY one-address|many-addresses
"""
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "integration"))
from job_processes import line_reader, start_coordinator  # noqa: E402
from job_verdict import check, failures  # noqa: E402

VERSIONS = 6
JOB = ["--trainers", "2", "--instances", "1", "--workers", "3", "--model-bytes", "32MiB", "--chunk-bytes", "1MiB",
       "--versions", str(VERSIONS), "--transport", "tcp", "--timeout", "90"]
# The flood loads a 2-core machine; this test is about admission, not failure detection.
COORDINATOR_ONLY = ["--heartbeat-timeout", "30"]
CASES = {
    "one-address": (["127.0.0.2"], 200),
    "many-addresses": ([f"127.0.0.{i}" for i in range(2, 10)], 25),
}


def main():
    ferry = os.path.abspath(sys.argv[1])
    sources, per_source = CASES[sys.argv[2]]
    work = tempfile.mkdtemp(prefix="ferry-flood-")
    log_path = os.path.join(work, "coordinator.log")
    log_file = open(log_path, "w")
    started = time.time()
    coordinator, address, env = start_coordinator(ferry, [*JOB, *COORDINATOR_ONLY], work, stderr=log_file)
    env["FERRY_LOG"] = "info"
    flood = subprocess.Popen([sys.executable, os.path.join(here, "idle_flood.py"), address, ",".join(sources),
                              str(per_source)], stdout=subprocess.PIPE, text=True)
    nodes = []
    delivered = []
    verdict = {}
    flood_stats = {}
    codes = []
    elapsed = 0.0
    try:
        held = flood.stdout.readline().strip()
        check(held == f"holding {len(sources) * per_source}", f"the flood opened its connections: {held!r}")
        time.sleep(1)  # the coordinator takes them in before any node connects
        roles = [["--role", "trainer", "--shard", "0"], ["--role", "trainer", "--shard", "1"]]
        roles += [["--role", "worker", "--instance", "0", "--rank", str(r)] for r in range(3)]
        for i, role in enumerate(roles):
            nodes.append(subprocess.Popen([ferry, "node", *JOB, "--coordinator", address, "--node-id", str(i + 1),
                                           *role], env=env, stdout=subprocess.DEVNULL,
                                          stderr=open(os.path.join(work, f"node{i + 1}.log"), "w")))
        lines = line_reader(coordinator.stdout)
        while True:
            try:
                line = lines.get(timeout=150)
            except queue.Empty:
                check(False, "the coordinator went silent for 150 s")
                break
            if line is None:
                break
            event = json.loads(line)
            if event.get("event") == "delivered":
                delivered.append(event)
                check(flood.poll() is None, f"the flood still runs at version {event['version']}")
            elif "verified" in event and "event" not in event:
                verdict = event
        coordinator.wait(timeout=30)
        elapsed = time.time() - started
        codes = [n.wait(timeout=60) for n in nodes]
        flood.terminate()
        flood_stats = json.loads(flood.communicate(timeout=30)[0].strip().splitlines()[-1])
    finally:
        for p in [coordinator, flood, *nodes]:
            if p.poll() is None:
                p.kill()
                p.wait()
    log = open(log_path).read().splitlines()

    check(coordinator.returncode == 0, f"coordinator exit code {coordinator.returncode}")
    check(codes == [0] * len(roles), f"node exit codes {codes}")
    check(verdict.get("verified") is True, f"job verified: {verdict.get('error', verdict)}")
    check(verdict.get("versions") == VERSIONS, f"versions {verdict.get('versions')} of {VERSIONS}")
    check(len(delivered) == VERSIONS and all(e.get("verified") for e in delivered),
          f"every version delivered verified while the flood ran: {len(delivered)} of {VERSIONS}")
    # The coordinator really was flooded: it turned connections away, and the flood replaced them.
    turned = [line for line in log if "turned away" in line]
    counted = 0
    for line in turned:
        m = re.search(r"turned away (\d+|a) connection", line)
        counted += 1 if m and m.group(1) == "a" else int(m.group(1)) if m else 0
    check(counted >= per_source * len(sources) - 32, f"the log counts {counted} connections turned away")
    check(any(s in line for line in turned for s in sources), "the log names the flood's addresses")
    check(flood_stats.get("dropped", 0) > 0, f"the coordinator dropped flood connections: {flood_stats}")
    # Bounded log: lines about the flood at most one a second, and the whole log small.
    about_flood = [line for line in log if any(s + ":" in line or s + " " in line or s + ")" in line for s in sources)]
    check(len(about_flood) <= elapsed + 3,
          f"{len(about_flood)} log lines about the flood in {elapsed:.0f} s (at most one a second)")
    check(len(log) <= 100 + elapsed, f"{len(log)} coordinator log lines in {elapsed:.0f} s")

    print(f"{sys.argv[2]}: {len(sources)} address(es) x {per_source} idle connections; flood {flood_stats}; "
          f"{len(delivered)} of {VERSIONS} versions delivered in {elapsed:.1f} s; coordinator log: {len(log)} lines, "
          f"{len(turned)} summaries counting {counted} connections turned away")
    if failures:
        print(f"{len(failures)} checks FAILED; coordinator log tail:\n" + "\n".join(log[-40:]))
        for i in range(len(nodes)):
            print(f"--- node {i + 1} log tail ---\n" + open(os.path.join(work, f"node{i + 1}.log")).read()[-1500:])
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
