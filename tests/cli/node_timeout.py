#!/usr/bin/python3
"""`ferry node --timeout` is a bound, and reaching it is a failure: a node whose coordinator never
answers (nothing listens there), or stops answering mid-job (SIGSTOP), exits 1 within a few
seconds of its timeout and names it; a node whose coordinator died (SIGKILL) exits 1 naming the
lost coordinator.

Usage: node_timeout.py FERRY_BINARY
"""
import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ferry = os.path.abspath(sys.argv[1])
work = tempfile.mkdtemp(prefix="ferry-timeout-")
atexit.register(shutil.rmtree, work, ignore_errors=True)
env = dict(os.environ, FERRY_SECRET="t" * 32, IPATH_NO_BACKTRACE="1")
job = ["--trainers", "1", "--instances", "1", "--workers", "1", "--model-bytes", "4MiB", "--chunk-bytes", "1MiB",
       "--versions", "100000"]
failed = 0


def check(what, run, started, bound, needle):
    global failed
    took = time.monotonic() - started
    last = (run.stderr.strip().splitlines() or [""])[-1]
    if run.returncode != 1 or needle not in last or took > bound:
        failed += 1
        print(f"FAILED {what}: exit {run.returncode} after {took:.1f} s (bound {bound} s); last line: {last!r}")
    else:
        print(f"ok {what}: exit 1 after {took:.1f} s: {last}")


def node(coordinator, role, timeout, *extra):
    return subprocess.Popen([ferry, "node", "--coordinator", coordinator, "--role", role, "--timeout", str(timeout),
                             *job, *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# 1. Nothing listens at the coordinator's address.
started = time.monotonic()
p = node("127.0.0.1:1", "worker", 2, "--node-id", "5", "--instance", "0", "--rank", "0")
out, err = p.communicate(timeout=60)
check("unreachable coordinator", subprocess.CompletedProcess(p.args, p.returncode, out, err), started, 12,
      "timed out after 2 s")

# 2 and 3. A job forms, then its coordinator freezes (SIGSTOP) or dies (SIGKILL).
for how in (signal.SIGSTOP, signal.SIGKILL):
    address_file = os.path.join(work, f"address.{how.name}")
    coordinator = subprocess.Popen([ferry, "coordinator", "--address-file", address_file, "--timeout", "120", *job],
                                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not os.path.exists(address_file) and time.monotonic() < deadline:
        time.sleep(0.05)
    address = open(address_file).read().strip()
    trainer = node(address, "trainer", 8, "--node-id", "1", "--shard", "0")
    worker = node(address, "worker", 8, "--node-id", "2", "--instance", "0", "--rank", "0")
    time.sleep(3)  # the job forms and updates run back to back
    started = time.monotonic()
    coordinator.send_signal(how)
    for who, p in (("trainer", trainer), ("worker", worker)):
        out, err = p.communicate(timeout=60)
        run = subprocess.CompletedProcess(p.args, p.returncode, out, err)
        if how == signal.SIGSTOP:
            check(f"{who} of a frozen coordinator", run, started, 12, "timed out after 8 s")
        else:
            check(f"{who} of a dead coordinator", run, started, 12, "lost the coordinator")
    coordinator.kill()
    coordinator.wait()

sys.exit(1 if failed else 0)
