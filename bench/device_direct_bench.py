#!/usr/bin/env python3
"""Device-direct against the plain peer copy and the host-staged paths, one trainer GPU to one
rollout GPU, in one run. Prints a markdown table; writes OUT/device_direct.json and .md.

  device_direct_bench.py BIN_DIR OUT_DIR [--gpus T,W] [--model llama3-8b|BYTES] [--depths 2,4]
                         [--chunks 64MiB,256MiB] [--versions 3]

BIN_DIR holds `ferry` and `ferry_gpu_bench`. The trainer's GPU T and the worker's GPU W default to
0,1 where two GPUs are visible and 0,0 (both processes on one GPU) where one is. Rows:
- the peer copy alone: `ferry_gpu_bench peer-export` on T, `peer-copy` on W, the same VMM mapping
  device-direct reads, chunk by chunk; and the same bytes copied inside W's own memory (D2D);
- the update, device-direct (`--p2p auto`), at each chunk size and depth;
- the update through host memory at the first chunk size and its best device-direct depth: shared host copies (`--p2p host
  --shared-host-copies`) and cma (`--p2p host`);
- device-direct verified: checksums and digests on, every byte compared on the rollout GPU;
- the peer copy after its owner was SIGKILLed (a mapping outlives its owner: no freed memory read).
Every process runs with NCCL_NVLS_ENABLE=0. Version 1 of each job is set-up; the later ones are timed."""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

bin_dir, out_dir = sys.argv[1], sys.argv[2]
args = dict(zip(sys.argv[3::2], sys.argv[4::2]))
ferry, bench = os.path.join(bin_dir, "ferry"), os.path.join(bin_dir, "ferry_gpu_bench")
env = dict(os.environ, NCCL_NVLS_ENABLE="0", NCCL_SOCKET_IFNAME="lo", IPATH_NO_BACKTRACE="1",
           LD_LIBRARY_PATH=os.pathsep.join(filter(None, [os.path.abspath(bin_dir), os.environ.get("LD_LIBRARY_PATH")])))
visible = sum(1 for l in subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.splitlines()
              if l.startswith("GPU "))
gpus = args.get("--gpus", "0,1" if visible > 1 else "0,0")
model = args.get("--model", "llama3-8b")
depths = [int(d) for d in args.get("--depths", "2,4").split(",")]
versions = int(args.get("--versions", "3"))
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
chunks = [int(c[:-3]) * UNITS[c[-3:]] for c in args.get("--chunks", "64MiB").split(",")]
CHUNK = chunks[0]
raw = {"gpus": gpus, "model": model, "visible_gpus": visible, "jobs": {}}


def log(*a):
    print(*a, flush=True)


def peer_copy(nbytes, kill_owner=False):
    trainer_gpu, worker_gpu = gpus.split(",")
    with tempfile.TemporaryDirectory() as d:
        owner = subprocess.Popen([bench, "peer-export", d, trainer_gpu, str(nbytes)], env=env, stderr=subprocess.PIPE,
                                 text=True)
        cmd = [bench, "peer-copy", d, worker_gpu, str(nbytes), str(CHUNK), "4"] + (["kill-owner"] if kill_owner else [])
        copier = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        owner.wait(timeout=60)
    if copier.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} -> {copier.returncode}: {copier.stderr[-2000:]}")
    r = json.loads(copier.stdout.strip().splitlines()[-1])
    r["peer_gbps"] = r["bytes"] / (r["peer_end"] - r["peer_start"]) / 1e9
    r["local_gbps"] = r["bytes"] / (r["local_end"] - r["local_start"]) / 1e9
    return r


def job(name, depth, *flags, verify=False, chunk=CHUNK):
    cmd = [ferry, "local", "--gpu-list", gpus, "--trainers", "1", "--instances", "1", "--workers", "1",
           "--chunk-bytes", str(chunk), "--depth", str(depth), "--versions", str(versions), "--transport", "cma",
           "--json", "--timeout", "400", *flags]
    cmd += ["--model", model] if model == "llama3-8b" else ["--model-bytes", model]
    if not verify:
        cmd += ["--no-checksums", "--no-verify"]
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=560)
    try:
        v = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        v = {}
    timed = v.get("per_version", [])[1:] or v.get("per_version", [])
    res = {"ok": p.returncode == 0, "verified": v.get("verified", False), "model_bytes": v.get("model_bytes", 0),
           "device_direct_pairs": v.get("device_direct_pairs", 0), "wall": time.time() - t,
           "gpus_checked": sum("every byte of version" in l for l in p.stderr.splitlines()),
           "update_s": statistics.median([x["seconds"] for x in timed]) if timed else float("nan"),
           "stall_s": statistics.median([x["stall_seconds"] for x in timed]) if timed else float("nan"),
           "busy": timed[-1]["busy"] if timed else {}}
    if not res["ok"]:
        res["stderr_tail"] = p.stderr[-3000:]
        log(f"{name} {chunk >> 20} MiB depth {depth} FAILED (exit {p.returncode}):\n{p.stderr[-3000:]}")
    raw["jobs"][f"{name}/{chunk >> 20}MiB/{depth}"] = res
    log(f"{name} {chunk >> 20} MiB depth {depth}: update {res['update_s']:.4f} s, stall {res['stall_s']:.4f} s, "
        f"GPU-to-GPU pairs {res['device_direct_pairs']}, wall {res['wall']:.0f} s")
    return res


def save():
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "device_direct.json"), "w") as f:
        json.dump(raw, f, indent=1)


rows = []
first = job("device-direct", depths[0])
nbytes = first["model_bytes"] or (16 << 30)
raw["peer"] = peer = peer_copy(nbytes // CHUNK * CHUNK)
log(f"peer copy alone: {peer['peer_gbps']:.1f} GB/s, inside the GPU: {peer['local_gbps']:.1f} GB/s")
save()
device = {(CHUNK, depths[0]): first}
for c in chunks:
    for d in depths:
        if (c, d) not in device:
            device[(c, d)] = job("device-direct", d, chunk=c)
best = min(depths, key=lambda d: device[(CHUNK, d)]["update_s"])
shared = job("shared host copies", best, "--p2p", "host", "--shared-host-copies")
cma = job("cma", best, "--p2p", "host")
checked = job("device-direct, verified", best, verify=True)
raw["peer_owner_killed"] = killed = peer_copy(min(nbytes, 4 << 30) // CHUNK * CHUNK, kill_owner=True)
save()


def row(name, r, depth, chunk=CHUNK):
    gbps = r["model_bytes"] / r["update_s"] / 1e9 if r["update_s"] == r["update_s"] else float("nan")
    return (f"| {name} | {chunk >> 20} MiB | {depth} | {r['update_s']:.4f} | {gbps:.1f} | {gbps / peer['peer_gbps']:.2f} | "
            f"{r['stall_s']:.4f} | {r['device_direct_pairs']} |")


lines = [f"GPUs {gpus} ({visible} visible), model {model}: {nbytes / 1e9:.2f} GB, "
         f"version 2..{versions} median", "",
         f"peer copy alone (VMM mapping, {CHUNK >> 20} MiB pieces): **{peer['peer_gbps']:.1f} GB/s**; the same bytes inside "
         f"GPU {gpus.split(',')[1]}: {peer['local_gbps']:.1f} GB/s; bytes checked: {peer['verified']}", "",
         "| path | chunk | depth | update s | GB/s | / peer copy | trainer stall s | GPU-to-GPU pairs |",
         "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
lines += [row("device-direct", device[(c, d)], d, c) for c in chunks for d in depths]
lines += [row("shared host copies", shared, best), row("cma", cma, best)]
lines += ["", f"device-direct with checksums, digests and every byte compared on the rollout GPU: "
          f"exit {'0' if checked['ok'] else 'non-zero'}, verified {checked['verified']}, "
          f"{checked['gpus_checked']} GPU(s) compared",
          f"peer copy after SIGKILL of its owner: bytes checked {killed['verified']} "
          f"({killed['bytes'] / 1e9:.1f} GB at {killed['peer_gbps']:.1f} GB/s)"]
table = "\n".join(lines) + "\n"
with open(os.path.join(out_dir, "device_direct.md"), "w") as f:
    f.write(table)
print(table)
ok = all(r["ok"] for r in raw["jobs"].values()) and checked["verified"] and peer["verified"] and killed["verified"]
sys.exit(0 if ok else 1)
