#!/usr/bin/env python3
"""The GPU benchmark: each stage alone (ferry_gpu_bench) and the whole update (`ferry local --gpus`)
at depth 1, 2, 4, 8, for two layouts of one 4-GPU host, in one run. Prints markdown tables and
writes every raw figure to OUT/gpu.json.

  gpu_bench.py BIN_DIR OUT_DIR [--quick]

BIN_DIR holds `ferry` and `ferry_gpu_bench`. A: trainer on GPU 0, instance on GPUs 1-3 (k = 1, 3
leaders). B: two trainers on GPUs 0-1, instance on GPUs 2-3 (k = 1, 2). On 2 GPUs: P, GPU 0 to
GPU 1; H1 and H2, a host-memory trainer to GPUs 0-1 (k = 1, 2). Every process:
NCCL_NVLS_ENABLE=0. GPU_BENCH_ONLY="A3:1,4;B2" picks scenarios and depths. A scenario name with an
"s" appended (B2s) runs with --shared-host-copies: leaders read the trainers' host copies in place,
so there is no P2P stage. With a "d" appended (B2d) the job takes device-direct (`--p2p auto`):
each leader copies its stripe GPU to GPU from the trainers' device copies, so its stages are that
peer copy (ferry_gpu_bench peer-export / peer-copy, every leader at once) and the collective; the
other names run with `--p2p host`, the host-staged path they always measured."""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

bin_dir, out_dir = sys.argv[1], sys.argv[2]
quick = "--quick" in sys.argv
ferry = os.path.join(bin_dir, "ferry")
bench = os.path.join(bin_dir, "ferry_gpu_bench")
env = dict(os.environ, NCCL_NVLS_ENABLE="0", NCCL_SOCKET_IFNAME="lo")
GiB = 1 << 30
CHUNK = 64 << 20
STAGE_BYTES = (2 if quick else 12) * GiB
DEPTH_STAGE = 4
DEPTHS = [1, 2] if quick else [1, 2, 4, 8]
VERSIONS = int(os.environ.get("GPU_BENCH_VERSIONS", 2 if quick else 3))
P2P = os.environ.get("GPU_BENCH_P2P", "cma")  # the transport between processes
# name: (trainer GPUs, instance GPUs, leaders k)
SCENARIOS = {"A1": ([0], [1, 2, 3], 1), "A3": ([0], [1, 2, 3], 3), "B1": ([0, 1], [2, 3], 1), "B2": ([0, 1], [2, 3], 2),
             # For 2-GPU hosts: one trainer GPU to one rollout GPU; a host-memory trainer (None) to two.
             "P": ([0], [1], 1), "H1": ([None], [0, 1], 1), "H2": ([None], [0, 1], 2)}
raw = {"stages": {}, "jobs": {}, "quick": quick, "p2p": P2P}


def log(*a):
    print(*a, flush=True)


def run_all(cmds, timeout=300, extra_env=None):
    """Starts every command at once; returns their parsed JSON lines (stdout's last line)."""
    e = dict(env, **(extra_env or {}))
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e) for c in cmds]
    out = []
    for c, p in zip(cmds, procs):
        so, se = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(c)} -> {p.returncode}\n{se[-3000:]}")
        lines = so.strip().splitlines()
        out.append(json.loads(lines[-1]) if lines else {})  # p2p senders print nothing
    return out


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9 if seconds > 0 else float("nan")


def span(results, start, end):
    return max(x[end] for x in results) - min(x[start] for x in results)


def device_stages(trainers, instance, k):
    """Device-direct's stages alone: each of the k leaders copies its stripe of the model from a
    trainer's GPU (leader i from trainer i mod T, all at once), then the collective."""
    s = {}
    dirs = [tempfile.TemporaryDirectory() for _ in range(k)]
    owners = [subprocess.Popen([bench, "peer-export", d.name, str(trainers[i % len(trainers)]), str(STAGE_BYTES // k)],
                               env=env) for i, d in enumerate(dirs)]
    r = run_all([[bench, "peer-copy", d.name, str(g), str(STAGE_BYTES // k), str(CHUNK), str(DEPTH_STAGE)]
                 for d, g in zip(dirs, instance[:k])])
    for o in owners:
        o.wait(timeout=60)
    for d in dirs:
        d.cleanup()
    s["peer"] = gbps(sum(x["bytes"] for x in r), span(r, "peer_start", "peer_end"))
    s["d2d"] = min(x["bytes"] / (x["local_end"] - x["local_start"]) / 1e9 for x in r)
    return s


def stages(name, trainers, instance, k, shared, device):
    """Each stage alone as the update runs it: every trainer GPU offloads its share, each of the
    k leaders receives (unless it reads in place) and uploads its stripe, the instance broadcasts
    (k = 1) or all-gathers. Device-direct: the peer copy and the collective."""
    s = device_stages(trainers, instance, k) if device else {}
    if not device and None not in trainers:
        r = run_all([[bench, "copy", str(g), str(STAGE_BYTES // len(trainers)), str(CHUNK), str(DEPTH_STAGE)] for g in trainers])
        s["d2h"] = gbps(sum(x["bytes"] for x in r), span(r, "d2h_start", "d2h_end"))
    elif not device:  # a host-memory trainer offloads with memcpy on its pool
        r = run_all([[bench, "host-offload", str(STAGE_BYTES // len(trainers)), str(CHUNK), str(DEPTH_STAGE)]
                     for _ in trainers])
        s["host_offload"] = gbps(sum(x["bytes"] for x in r), span(r, "start", "end"))
    if not device:
        r = run_all([[bench, "copy", str(g), str(STAGE_BYTES // k), str(CHUNK), str(DEPTH_STAGE)] for g in instance[:k]])
        s["h2d"] = gbps(sum(x["bytes"] for x in r), span(r, "h2d_start", "h2d_end"))
    if not shared and not device:  # P2P: every trainer process writes its share of each stripe into that leader's slots
        dirs = [tempfile.TemporaryDirectory() for _ in range(k)]
        args = [str(len(trainers)), str(STAGE_BYTES // k), str(CHUNK), str(DEPTH_STAGE), P2P]
        cmds = [[bench, "p2p-recv", d.name] + args for d in dirs]
        cmds += [[bench, "p2p-send", d.name, str(i)] + args for d in dirs for i in range(len(trainers))]
        r = [x for x in run_all(cmds, timeout=240) if x]
        for d in dirs:
            d.cleanup()
        s["p2p"] = gbps(sum(x["bytes"] for x in r), span(r, "start", "end"))
    with tempfile.TemporaryDirectory() as d:
        r = run_all([[bench, "bcast", d, str(rank), str(len(instance)), str(g), str(STAGE_BYTES), str(CHUNK),
                      str(DEPTH_STAGE), str(k)] for rank, g in enumerate(instance)])
        s["collective"] = gbps(r[0]["bytes"], span(r, "start", "end"))
        s["collective_first_seconds"] = max(x["first_seconds"] for x in r)
    raw["stages"][name] = s
    log(f"{name} stages alone (GB/s): {json.dumps(s)}")
    return s


def job(name, trainers, instance, k, depth, shared, device):
    cmd = [ferry, "local", "--gpus", "--trainers", str(len(trainers)), "--instances", "1", "--workers", str(len(instance)),
           "--stripes", str(k), "--chunk-bytes", str(CHUNK), "--depth", str(depth), "--versions", str(VERSIONS),
           "--no-checksums", "--no-verify", "--transport", P2P, "--json", "--timeout", "400"]
    cmd += ["--model-bytes", str(2 * GiB)] if quick else ["--model", "llama3-8b"]
    if None in trainers:
        cmd.append("--host-trainers")
    if shared:
        cmd.append("--shared-host-copies")
    if not device:
        cmd += ["--p2p", "host"]
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=560)
    ok = p.returncode == 0
    verified_lines = [l for l in p.stderr.splitlines() if "every byte of version" in l]
    try:
        v = json.loads(p.stdout.strip().splitlines()[-1])
    except Exception:
        v = {}
    per = v.get("per_version", [])
    timed = per[1:] if len(per) > 1 else per  # version 1 includes the NCCL communicator's creation
    res = {"ok": ok, "exit": p.returncode, "gpus_verified": len(verified_lines), "model_bytes": v.get("model_bytes", 0),
           "versions": per, "wall": time.time() - t,
           "update_s": statistics.median([x["seconds"] for x in timed]) if timed else float("nan"),
           "stall_s": statistics.median([x["stall_seconds"] for x in timed]) if timed else float("nan"),
           "busy": timed[-1]["busy"] if timed else {}}
    if not ok or len(verified_lines) != len(instance):
        res["stderr_tail"] = p.stderr[-3000:]
        log(f"job {name} depth {depth} FAILED (exit {p.returncode}, {len(verified_lines)} GPUs verified):\n{p.stderr[-3000:]}")
    raw["jobs"].setdefault(name, {})[depth] = res
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gpu.json"), "w") as f:  # as we go: a cut-off run keeps its figures
        json.dump(raw, f, indent=1)
    log(f"{name} depth {depth}: update {res['update_s']:.3f} s, stall {res['stall_s']:.3f} s, "
        f"{res['gpus_verified']}/{len(instance)} rollout GPUs verified, wall {res['wall']:.0f} s")
    return res


only = os.environ.get("GPU_BENCH_ONLY", "")  # e.g. "A3" or "A1:1,4;A3"
picked = {}
for part in (only.split(";") if only else ["A1", "A3", "B1", "B2"]):
    n, _, ds = part.partition(":")
    picked[n] = [int(x) for x in ds.split(",")] if ds else DEPTHS

tables = []
for name, depths in picked.items():
    shared, device = name.endswith("s"), name.endswith("d")
    trainers, instance, k = SCENARIOS[name.removesuffix("s").removesuffix("d")]
    s = stages(name, trainers, instance, k, shared, device)
    for d in depths:
        job(name, trainers, instance, k, d, shared, device)
    jobs = raw["jobs"][name]
    model = max(j["model_bytes"] for j in jobs.values()) or STAGE_BYTES
    collective = "broadcast" if k == 1 else f"all-gather of {k} stripes"
    p2p = "none: leaders read the host copies in place" if shared else f"{P2P}, {len(trainers)} sender(s) to {k} leader(s)"
    rates = {"D2H": s.get("d2h", float("inf")), "offload (host memcpy)": s.get("host_offload", float("inf")),
             f"P2P ({p2p})": s.get("p2p", float("inf")),
             f"H2D ({k} leader GPU(s))": s.get("h2d", float("inf")),
             f"peer copy GPU to GPU ({k} leader(s) at once)": s.get("peer", float("inf")),
             "offload inside the trainer's GPU (D2D)": s.get("d2d", float("inf")),
             f"NCCL {collective}": s["collective"]}
    slow_name, slow = min(rates.items(), key=lambda kv: kv[1])
    slow_s = model / slow / 1e9
    best_d = min(jobs, key=lambda d: jobs[d]["update_s"])
    t = [f"### {name}: trainers on GPUs {trainers}, instance on GPUs {instance}, k = {k}"
         f"{', shared host copies' if shared else ''}", "",
         "| stage alone | GB/s | seconds for the model |", "| --- | ---: | ---: |"]
    t += [f"| {n} | {v:.1f} | {model / v / 1e9:.3f} |" for n, v in rates.items() if v != float("inf")]
    t += ["", f"slowest stage: {slow_name}; model {model / 1e9:.2f} GB", "",
          "| depth | update s | whole update / slowest stage | trainer stall / whole update | update GB/s | "
          f"depth-{depths[0]} / this depth | rollout GPUs verified |",
          "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for d in depths:
        j = jobs[d]
        t.append(f"| {d} | {j['update_s']:.3f} | {j['update_s'] / slow_s:.2f} | {j['stall_s'] / j['update_s']:.2f} | "
                 f"{model / j['update_s'] / 1e9:.1f} | {jobs[depths[0]]['update_s'] / j['update_s']:.2f} | "
                 f"{j['gpus_verified']}/{len(instance)} |")
    b = jobs[best_d]
    offload = "D2H" if "d2h" in s else ("offload inside the trainer's GPU (D2D)" if "d2d" in s else "offload (host memcpy)")
    stall = f"; stall at best depth / {offload} alone: {b['stall_s'] / (model / rates[offload] / 1e9):.2f}"
    t += ["", f"depth-{depths[0]} / best depth ({best_d}): {jobs[depths[0]]['update_s'] / b['update_s']:.2f}{stall}", "",
          f"Stages inside the update at depth {best_d} (busy seconds of the busiest participant, against "
          f"{b['update_s']:.3f} s for the whole update): " +
          ", ".join(f"{n} {v:.3f}" for n, v in b["busy"].items()), ""]
    tables.append("\n".join(t))

# Striped against one leader, and shared host copies against P2P writes, of whatever ran.
pairs = [(f"{a}{s}", f"{b}{t}") for a, b in (("B2", "B1"), ("A3", "A1"), ("H2", "H1")) for s, t in (("", ""), ("s", "s"), ("s", ""))]
pairs += [(f"{n}s", n) for n in SCENARIOS] + [(f"{n}d", n) for n in SCENARIOS] + [(f"{n}d", f"{n}s") for n in SCENARIOS]
for x, y in dict.fromkeys(pairs):
    if x in raw["jobs"] and y in raw["jobs"]:
        fx = min(j["update_s"] for j in raw["jobs"][x].values())
        fy = min(j["update_s"] for j in raw["jobs"][y].values())
        tables.append(f"{x} against {y} at their best depths: {fy / fx:.2f}x faster\n")

os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, "gpu.json"), "w") as f:
    json.dump(raw, f, indent=1)
with open(os.path.join(out_dir, "gpu_tables.md"), "w") as f:
    f.write("\n".join(tables))
print("\n".join(tables))
