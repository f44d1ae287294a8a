"""Starting a job's processes by hand, as a cluster launcher would: a job secret, then the
coordinator, whose events and verdict come as JSON lines on its stdout."""
import os
import queue
import subprocess
import sys
import threading
import time


def start_coordinator(ferry, job, scratch, stderr=subprocess.PIPE, preexec_fn=None):
    """Writes a job secret into `scratch` and starts `ferry coordinator JOB --events --json`
    (`preexec_fn` runs in the child before exec). Returns (the process, its address, the
    environment every process of the job needs)."""
    secret = os.path.join(scratch, "secret")
    with open(secret, "wb") as f:
        f.write(os.urandom(32))
    os.chmod(secret, 0o600)
    env = dict(os.environ, FERRY_SECRET_FILE=secret, IPATH_NO_BACKTRACE="1")
    address_file = os.path.join(scratch, "coordinator")
    coordinator = subprocess.Popen([ferry, "coordinator", *job, "--address-file", address_file, "--events", "--json"],
                                   stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
                                   preexec_fn=preexec_fn)
    deadline = time.time() + 30
    while not os.path.exists(address_file) and time.time() < deadline:
        time.sleep(0.02)
    return coordinator, open(address_file).read().strip(), env


def line_reader(stream):
    """Reads `stream` on a thread of its own; returns a queue of its lines, then None at its end.
    (select() on a buffered pipe misses lines already read into Python's buffer.)"""
    lines = queue.Queue()

    def pump():
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def exit_failed(failures, events, verdict, logs, coordinator_log):
    """Prints why a job test failed, with the job's events and verdict and the end of every
    process's log (`logs`: node id -> its open log; `coordinator_log`: the coordinator's stderr),
    then exits 1."""
    print("FAILED:", "; ".join(failures))
    print("events:", events, "\nverdict:", verdict)
    for node_id, log in logs.items():
        log.seek(0)
        print(f"--- node {node_id} ---\n" + log.read()[-3000:])
    coordinator_log.seek(0)
    print("--- coordinator stderr ---\n" + coordinator_log.read()[-4000:])
    sys.exit(1)
