#!/usr/bin/python3
"""Two hosts on one machine (issue 15): two Linux network namespaces joined by a veth pair, made
here and removed at the end. The coordinator and the trainer run in one, both workers in the other,
each process bound to its side's address.

- Over tcp and over fabric (tcp;ofi_rxm) every version is delivered and verified.
- The workers' side is cut off mid-update for longer than the heartbeat timeout: they are given
  up, register again when the link returns, and the job delivers every version.
- Over cma, and with shared host copies, the same-host path is refused across the namespaces: the
  job fails within seconds, every process exits non-zero, and the error says why.

- Through the public API (examples/python, given PYTHON): the trainer and its coordinator in one
  namespace, two rollouts in the other, each member listening where the coordinator's side reaches
  it without being told; every version verified.

Exits 77 (ctest: skipped) with the reason when this process cannot make namespaces.

Usage: two_namespaces.py FERRY_BINARY [PYTHON EXAMPLES_DIR]  (PYTHONPATH: the ferry package)
"""
import json
import os
import subprocess
import sys
import tempfile
import time

from job_verdict import check, failures

SKIP = 77
ADDRESSES = {"a": "10.77.0.1", "b": "10.77.0.2"}
JOB = ["--trainers", "1", "--instances", "1", "--workers", "2", "--model-bytes", "16MiB", "--chunk-bytes", "1MiB",
       "--versions", "3", "--timeout", "60"]
HEARTBEAT_TIMEOUT = 3  # seconds, in the cut run
CUT_SECONDS = 8  # longer than the heartbeat timeout


def ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True)


def make_namespaces(tag):
    """Namespace names by side, or the reason they cannot be made."""
    names = {side: f"ferry{tag}{side}" for side in ADDRESSES}
    links = {side: f"fv{tag}{side}" for side in ADDRESSES}
    steps = [["netns", "add", names["a"]], ["netns", "add", names["b"]],
             ["link", "add", links["a"], "type", "veth", "peer", "name", links["b"]]]
    for side in ADDRESSES:
        steps += [["link", "set", links[side], "netns", names[side]],
                  ["-n", names[side], "addr", "add", f"{ADDRESSES[side]}/24", "dev", links[side]],
                  ["-n", names[side], "link", "set", links[side], "up"],
                  ["-n", names[side], "link", "set", "lo", "up"]]
    for step in steps:
        done = ip(*step)
        if done.returncode != 0:
            remove_namespaces(names)
            return None, f"'ip {' '.join(step)}' failed: {done.stderr.strip()}"
    return names, None


def remove_namespaces(names):
    for name in names.values():
        ip("netns", "del", name)  # takes its end of the veth pair, and so the pair, with it


def run_job(ferry, names, transport, env, scratch, job=JOB, coordinator_flags=(), meanwhile=None):
    """Starts the job's four processes across the namespaces, calls `meanwhile(coordinator)` once
    they run; returns (coordinator verdict or None, exit codes, stderr of every process, seconds)."""
    address_file = os.path.join(scratch, f"coordinator.{transport[0]}.{len(os.listdir(scratch))}")
    start = time.time()

    def spawn(side, args):
        log = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen(["ip", "netns", "exec", names[side], ferry, *args, *job, *transport,
                                 "--bind", ADDRESSES[side]], stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        return proc, log

    coordinator = spawn("a", ["coordinator", "--address-file", address_file, "--json", *coordinator_flags])
    deadline = time.time() + 30
    while not os.path.exists(address_file) and time.time() < deadline:
        time.sleep(0.02)
    if not os.path.exists(address_file):
        coordinator[0].kill()
        return None, [None], ["the coordinator wrote no address"], time.time() - start
    address = open(address_file).read().strip()
    member = ["node", "--coordinator", address]
    nodes = [spawn("a", [*member, "--node-id", "1", "--role", "trainer", "--shard", "0"]),
             spawn("b", [*member, "--node-id", "2", "--role", "worker", "--instance", "0", "--rank", "0"]),
             spawn("b", [*member, "--node-id", "3", "--role", "worker", "--instance", "0", "--rank", "1"])]
    if meanwhile:
        meanwhile(coordinator[0])
    out, _ = coordinator[0].communicate(timeout=120)
    codes = [coordinator[0].returncode]
    for proc, _ in nodes:
        try:
            codes.append(proc.wait(timeout=30))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
    logs = []
    for _, log in [coordinator, *nodes]:
        log.seek(0)
        logs.append(log.read())
    lines = [line for line in out.splitlines() if line.startswith("{")]
    verdict = json.loads(lines[-1]) if lines else None
    return verdict, codes, logs, time.time() - start


def cut_link(ferry, names, env, scratch, transport):
    """The workers' side is cut off for longer than the heartbeat timeout while an update is in
    flight; the coordinator gives them up; when the link returns they register again and the job
    delivers every version, verified."""
    job = ["--trainers", "1", "--instances", "1", "--workers", "2", "--model-bytes", "64MiB", "--chunk-bytes", "4MiB",
           "--versions", "30", "--timeout", "90"]
    link = f"fv{names['b'][len('ferry'):]}"

    def cut_for_a_while(coordinator):
        # Cut once the workers have joined and taken a version (its --events line), so that the
        # next update is in flight: a cut timed from the start came before they joined on a
        # loaded machine, and no update spanned it.
        deadline = time.time() + 60
        while time.time() < deadline:
            line = coordinator.stdout.readline()
            if not line or (line.startswith("{") and json.loads(line).get("event") == "delivered"):
                break
        ip("-n", names["b"], "link", "set", link, "down")
        time.sleep(CUT_SECONDS)
        ip("-n", names["b"], "link", "set", link, "up")

    what = " ".join(transport)
    verdict, codes, logs, seconds = run_job(ferry, names, transport, env, scratch, job,
                                            ["--heartbeat-timeout", str(HEARTBEAT_TIMEOUT), "--events"],
                                            cut_for_a_while)
    ok = check(verdict is not None and verdict.get("verified") is True and verdict.get("versions") == 30,
               f"{what}, a cut link: verdict {verdict}")
    ok = check(codes == [0, 0, 0, 0], f"{what}, a cut link: exit codes {codes}") and ok
    slowest = max((v["seconds"] for v in (verdict or {}).get("per_version", [])), default=0)
    # The update in flight at the cut lasts at least until its workers are given up (one heartbeat
    # after the last one heard, plus the timeout): it completes when they return, or at the give-up
    # if the workers that left held it all.
    ok = check(slowest > HEARTBEAT_TIMEOUT - 0.5,
               f"{what}, a cut link: no update was in flight across the cut (slowest {slowest:.1f} s)") and ok
    ok = check(all("registering again" in log for log in logs[2:]),
               f"{what}, a cut link: the workers were not given up and asked to register again") and ok
    if not ok:
        print("\n".join(log[-3000:] for log in logs))
    else:
        print(f"ok: {what}: the workers' link cut for {CUT_SECONDS} s mid-update: given up, registered again, "
              f"30 versions verified in {seconds:.1f} s")


def api_across(python, examples, names, env, scratch):
    """examples/python's trainer.py (coordinator inside) in one namespace, two rollout.py in the
    other; the members name no listen address."""
    address_file = os.path.join(scratch, "api_coordinator")

    def spawn(side, script, *args):
        return subprocess.Popen(["ip", "netns", "exec", names[side], python, os.path.join(examples, script), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)

    start = time.time()
    trainer = spawn("a", "trainer.py", "--rollouts", "2", "--versions", "3",
                    "--listen", f"tcp://{ADDRESSES['a']}:0", "--address-file", address_file)
    while not os.path.exists(address_file) and time.time() - start < 30 and trainer.poll() is None:
        time.sleep(0.02)
    if not os.path.exists(address_file):
        trainer.kill()
        check(False, f"the API trainer wrote no address: {trainer.communicate()[0][-2000:]}")
        return
    address = open(address_file).read().strip()
    rollouts = [spawn("b", "rollout.py", "--coordinator", address, "--rank", str(r), "--versions", "3") for r in (0, 1)]
    outputs, codes = [], []
    for proc in [trainer, *rollouts]:
        try:
            outputs.append(proc.communicate(timeout=90)[0])
        except subprocess.TimeoutExpired:
            proc.kill()
            outputs.append(proc.communicate()[0])
        codes.append(proc.returncode)
    ok = check(codes == [0, 0, 0], f"the API across namespaces: exit codes {codes}")
    ok = check(all("version 3 verified" in out for out in outputs[1:]),
               "the API across namespaces: a rollout did not verify version 3") and ok
    if not ok:
        print("\n".join(out[-2000:] for out in outputs))
    else:
        print(f"ok: the public API (Python) across namespaces: 3 versions verified in {time.time() - start:.1f} s")


def main():
    ferry = os.path.abspath(sys.argv[1])
    python, examples = (sys.argv[2], os.path.abspath(sys.argv[3])) if len(sys.argv) > 3 else (None, None)
    if os.geteuid() != 0:
        print("skipped: making network namespaces needs root")
        return SKIP
    names, why = make_namespaces(str(os.getpid() % 100000))
    if names is None:
        print(f"skipped: cannot make network namespaces here: {why}")
        return SKIP
    try:
        with tempfile.TemporaryDirectory() as scratch:
            secret = os.path.join(scratch, "secret")
            with open(secret, "wb") as f:
                f.write(os.urandom(32))
            os.chmod(secret, 0o600)
            env = dict(os.environ, FERRY_SECRET_FILE=secret, IPATH_NO_BACKTRACE="1", FERRY_LOG="warn")
            env.pop("FI_TCP_IFACE", None)  # each namespace has its own interfaces; --bind picks one
            for transport in (["--transport", "tcp"], ["--transport", "fabric", "--fabric-provider", "tcp;ofi_rxm"]):
                what = " ".join(transport)
                verdict, codes, logs, seconds = run_job(ferry, names, transport, env, scratch)
                ok = check(verdict is not None and verdict.get("verified") is True and verdict.get("versions") == 3,
                           f"{what} across namespaces: verdict {verdict}")
                ok = check(codes == [0, 0, 0, 0], f"{what}: exit codes {codes}") and ok
                if not ok:
                    print("\n".join(log[-2000:] for log in logs))
                else:
                    print(f"ok: {what}: 3 versions verified across two namespaces in {seconds:.1f} s")
                cut_link(ferry, names, env, scratch, transport)
            if python:
                api_across(python, examples, names, env, scratch)
            else:
                print("not run: the public API across namespaces (no Python module built)")
            for transport, says in ((["--transport", "cma"], "cannot write to node 2 with same-host copies"),
                                    (["--transport", "cma", "--shared-host-copies"],
                                     "cannot read a trainer's host copy in place")):
                what = " ".join(transport)
                verdict, codes, logs, seconds = run_job(ferry, names, transport, env, scratch)
                ok = check(verdict is not None and not verdict.get("verified") and verdict.get("versions") == 0,
                           f"{what}: delivered across namespaces: {verdict}")
                ok = check(all(c not in (0, None) for c in codes), f"{what}: exit codes {codes}") and ok
                ok = check(seconds < 30, f"{what}: took {seconds:.1f} s to fail (the bound is 30 s)") and ok
                ok = check(says in logs[0] and "another pid or network namespace" in logs[0],
                           f"{what}: the coordinator's log does not say '{says}'") and ok
                if not ok:
                    print("\n".join(log[-2000:] for log in logs))
                else:
                    print(f"ok: {what}: refused across namespaces in {seconds:.1f} s, saying why")
    finally:
        remove_namespaces(names)
    if failures:
        print(f"{len(failures)} checks FAILED")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
