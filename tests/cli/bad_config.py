#!/usr/bin/python3
"""`ferry` under bad flags, files and values: each run must exit with code 2 within seconds and
print exactly one line on stderr that names what was wrong (no stack trace, no hang).

Usage: bad_config.py FERRY_BINARY
"""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile

ferry = os.path.abspath(sys.argv[1])
work = tempfile.mkdtemp(prefix="ferry-cli-")
atexit.register(shutil.rmtree, work, ignore_errors=True)
short_secret = os.path.join(work, "short")
with open(short_secret, "w") as f:
    f.write("too short\n")
good_secret = os.path.join(work, "good")
with open(good_secret, "wb") as f:
    f.write(b"s" * 32)
missing = os.path.join(work, "no-such-secret")

node = ["node", "--role", "worker", "--node-id", "3"]
secret_ok = {"FERRY_SECRET_FILE": good_secret}
# (what, arguments, extra environment, text the one stderr line must contain)
cases = [
    ("unknown flag", ["demo", "--bogus"], {}, "--bogus"),
    ("unknown subcommand", ["launch-rockets"], {}, "launch-rockets"),
    ("chunk size not a multiple of 256", ["demo", "--chunk-bytes", "100"], {}, "--chunk-bytes 100"),
    ("chunk size not a size", ["demo", "--chunk-bytes", "lots"], {}, "--chunk-bytes"),
    ("model of 0 bytes", ["demo", "--model-bytes", "0"], {}, "--model-bytes 0"),
    ("depth 0", ["demo", "--depth", "0"], {}, "--depth"),
    ("no trainers", ["demo", "--trainers", "0"], {}, "--trainers"),
    ("unknown transport", ["demo", "--transport", "carrier-pigeon"], {}, "--transport"),
    ("negative timeout", ["local", "--timeout", "-5"], {}, "--timeout"),
    ("local over inproc", ["local", "--transport", "inproc"], {}, "--transport"),
    ("unknown p2p mode", ["demo", "--p2p", "nvlink"], {}, "--p2p"),
    ("a GPU list longer than the GPU nodes", ["local", "--gpu-list", "0,0,0", "--trainers", "1", "--instances", "1",
                                              "--workers", "1"], {}, "--gpu-list names 3 GPUs for 2 GPU nodes"),
    ("two workers of a sharing instance on one GPU", ["local", "--gpu-list", "0,1,1", "--trainers", "1", "--instances",
                                                      "1", "--workers", "2"], {}, "instance 0 has two workers on GPU 1"),
    ("a GPU not there", ["local", "--gpu-list", "0,99", "--trainers", "1", "--instances", "1", "--workers", "1"], {},
     "--gpu-list: GPU"),
    ("a demo larger than any host", ["demo", "--model-bytes", "1TiB"], {}, "GiB of host memory"),
    ("a local job larger than any host", ["local", "--model-bytes", "1TiB", "--transport", "tcp"], {},
     "GiB of host memory"),
    ("coordinator with a bad chunk size", ["coordinator", "--chunk-bytes", "100"], secret_ok, "--chunk-bytes 100"),
    ("node with a model of 0 bytes", node + ["--coordinator", "127.0.0.1:1", "--model-bytes", "0"], secret_ok,
     "--model-bytes 0"),
    ("missing secret file", ["coordinator"], {"FERRY_SECRET_FILE": missing}, missing),
    ("secret file too short", ["coordinator"], {"FERRY_SECRET_FILE": short_secret}, short_secret),
    ("no secret at all", ["coordinator"], {}, "FERRY_SECRET_FILE"),
    ("node without --coordinator", node, secret_ok, "--coordinator"),
    ("malformed --coordinator", node + ["--coordinator", "not-an-address"], secret_ok, "--coordinator 'not-an-address'"),
    ("--coordinator without a port", node + ["--coordinator", "127.0.0.1"], secret_ok, "--coordinator '127.0.0.1'"),
    ("--coordinator port out of range", node + ["--coordinator", "127.0.0.1:99999"], secret_ok,
     "--coordinator '127.0.0.1:99999'"),
    ("unknown role", ["node", "--role", "janitor", "--node-id", "3", "--coordinator", "127.0.0.1:1"], secret_ok,
     "--role"),
    ("node id 0 (the coordinator's)", ["node", "--role", "worker", "--node-id", "0", "--coordinator", "127.0.0.1:1"],
     secret_ok, "--node-id"),
]

failed = 0
for what, args, extra, needle in cases:
    env = {k: v for k, v in os.environ.items() if k not in ("FERRY_SECRET", "FERRY_SECRET_FILE")}
    env.update(extra)
    try:
        run = subprocess.run([ferry, *args], env=env, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        print(f"FAILED {what}: ferry {' '.join(args)} still runs after 20 s")
        failed += 1
        continue
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    problems = []
    if run.returncode != 2:
        problems.append(f"exit code {run.returncode}, not 2")
    if len(lines) != 1:
        problems.append(f"{len(lines)} lines on stderr, not 1")
    if not any(needle in line for line in lines):
        problems.append(f"stderr does not name {needle!r}")
    if problems:
        failed += 1
        print(f"FAILED {what}: ferry {' '.join(args)}: {'; '.join(problems)}\n  stderr: {run.stderr!r}")
    else:
        print(f"ok   {what}: {lines[0]}")
print(f"{len(cases) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
