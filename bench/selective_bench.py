#!/usr/bin/env python3
"""Selective delivery against whole-model delivery, in one run: the same job with every worker
holding the whole model (--shard-rollout none) and with each instance's workers splitting it
(tp: rows, ep: experts, a dense layer's MLP counting as one, pp-tp: a pipeline stage's rows, its
norms whole on each of the stage's ranks and relayed along a chain). Prints a markdown table and writes the
raw figures to OUT/selective_<host>.json.

  selective_bench.py FERRY OUT_DIR            # CPU: `ferry demo` in one process over tcp
  selective_bench.py FERRY OUT_DIR --gpus     # GPU host: `ferry local --gpus`, one process per GPU
  ... --no-verify                             # time without digests (the trainers' xxh3 of every
                                              # byte then bounds the update); bytes are not checked

Per job: the update time (median of versions 2..N; version 1 warms up), the bytes the plan sends
each worker (`worker_bytes`, the most of any worker) against what it holds (`receive_ratio`), and
on the CPU the bytes measured landing in each worker's node (`worker_link_bytes`: bulk writes,
trainer and chain alike)."""
import json
import os
import socket
import statistics
import subprocess
import sys

ferry, out_dir = sys.argv[1], sys.argv[2]
gpus = "--gpus" in sys.argv
verify = "--no-verify" not in sys.argv
env = dict(os.environ, NCCL_NVLS_ENABLE="0", NCCL_SOCKET_IFNAME="lo", IPATH_NO_BACKTRACE="1", FI_TCP_IFACE="lo")
VERSIONS = 4


def job(sharding, workers, stripes=0):
    if gpus:
        cmd = [ferry, "local", "--gpus", "--trainers", "1", "--instances", "1", "--workers", str(workers),
               "--model-bytes", "6GiB", "--chunk-bytes", "64MiB", "--transport", "cma", "--no-checksums",
               "--timeout", "240"]
    else:
        cmd = [ferry, "demo", "--trainers", "2", "--instances", "2", "--workers", str(workers), "--model-bytes",
               "512MiB", "--chunk-bytes", "8MiB", "--transport", "tcp"]
    cmd += ["--versions", str(VERSIONS), "--stripes", str(stripes), "--shard-rollout", sharding, "--json"]
    if not verify:
        cmd.append("--no-verify")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} -> {p.returncode}\n{p.stderr[-3000:]}")
    j = json.loads(lines[-1])
    j["update_seconds"] = statistics.median(v["seconds"] for v in j["per_version"][1:])
    j["command"] = " ".join(cmd[1:])
    return j


def main():
    raw = {"host": socket.gethostname(), "gpus": gpus, "jobs": []}
    rows, bases = [], {}
    sizes = [3] if gpus else [2, 4]
    for n in sizes:
        # Whole-model delivery with one leader (every worker's link carries the model) and with n
        # leaders (each receives a stripe, the instance all-gathers the rest), then the shards.
        whole = {k: job("none", n, k) for k in (1, n)}
        for k, j in whole.items():
            raw["jobs"].append(dict(j, sharding="none", workers=n, stripes=k))
        base = bases[n] = whole[1]
        for sharding in ("tp", "ep", "pp-tp"):
            j = job(sharding, n)
            raw["jobs"].append(dict(j, sharding=sharding, workers=n))
            rows.append((n, sharding, j, base, whole[n]))
        rows.append((n, "none k=n", whole[n], base, whole[n]))
    os.makedirs(out_dir, exist_ok=True)
    name = f"selective_{'gpu' if gpus else 'cpu'}{'' if verify else '_unverified'}.json"
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(raw, f, indent=1)
    link = "" if gpus else " worker link GB (measured) | link / whole k=1 |"
    print(f"| workers n | delivery | update s | / whole k=1 | / whole k=n | worker GB (plan) | / model | "
          f"receives / holds |{link} verified |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if not gpus else "") + " --- |")
    for n, name, j, base, striped in rows:
        cells = [n, name, f"{j['update_seconds']:.3f}", f"{j['update_seconds'] / base['update_seconds']:.2f}",
                 f"{j['update_seconds'] / striped['update_seconds']:.2f}", f"{j['worker_bytes'] / 1e9:.3f}",
                 f"{j['worker_bytes'] / j['model_bytes']:.3f}", f"{j['receive_ratio']:.3f}"]
        if not gpus:
            cells += [f"{j['worker_link_bytes'] / 1e9:.3f}", f"{j['worker_link_bytes'] / base['worker_link_bytes']:.3f}"]
        cells.append(("yes" if j["verified"] else "NO") if verify else "off")
        print("| " + " | ".join(str(c) for c in cells) + " |")
    print("\nwhole k=1 update: " + ", ".join(f"n={n}: {j['update_seconds']:.3f} s" for n, j in bases.items()))


main()
