#!/usr/bin/env python3
"""The GPU benchmark: each stage alone (ferry_gpu_bench) and the whole update (`ferry local --gpus`)
at depth 1, 2, 4, 8, for two layouts of one 4-GPU host, in one run. Prints markdown tables and
writes every raw figure to OUT/gpu.json.

  gpu_bench.py BIN_DIR OUT_DIR [--quick]

BIN_DIR holds `ferry` and `ferry_gpu_bench`. A: trainer on GPU 0, instance on GPUs 1-3.
B: two trainers on GPUs 0-1, instance on GPUs 2-3. Every process: NCCL_NVLS_ENABLE=0."""
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
env = dict(os.environ, NCCL_NVLS_ENABLE="0", NCCL_SOCKET_IFNAME="lo", FI_SHM_DISABLE_CMA="1")
GiB = 1 << 30
CHUNK = 64 << 20
STAGE_BYTES = (2 if quick else 15) * GiB
DEPTH_STAGE = 4
DEPTHS = [1, 2] if quick else [1, 2, 4, 8]
VERSIONS = int(os.environ.get("GPU_BENCH_VERSIONS", 2 if quick else 3))
SCENARIOS = {"A": ([0], [1, 2, 3]), "B": ([0, 1], [2, 3])}
raw = {"stages": {}, "jobs": {}, "quick": quick}


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


def stages(name, trainers, instance):
    s = {}
    # D2H: every trainer GPU at once (offload runs on all shards together).
    r = run_all([[bench, "copy", str(g), str(STAGE_BYTES // len(trainers)), str(CHUNK), str(DEPTH_STAGE)] for g in trainers])
    s["d2h"] = gbps(sum(x["bytes"] for x in r), max(x["d2h_end"] for x in r) - min(x["d2h_start"] for x in r))
    # H2D: every byte goes up through the one leader's PCIe link (k = 1).
    r = run_all([[bench, "copy", str(instance[0]), str(STAGE_BYTES), str(CHUNK), str(DEPTH_STAGE)]])
    s["h2d"] = gbps(r[0]["bytes"], r[0]["h2d_end"] - r[0]["h2d_start"])
    # P2P: every trainer process writes its share into the leader process's slots.
    s["p2p"] = {}
    schemes = [("tcp", ""), ("fabric", "shm")]
    if os.environ.get("GPU_BENCH_P2P"):  # e.g. "tcp": skip the others
        schemes = [x for x in schemes if x[0] in os.environ["GPU_BENCH_P2P"].split(",")]
    for scheme, provider in schemes:
        with tempfile.TemporaryDirectory() as d:
            args = [str(len(trainers)), str(STAGE_BYTES), str(CHUNK), str(DEPTH_STAGE), scheme] + ([provider] if provider else [])
            cmds = [[bench, "p2p-recv", d] + args] + [[bench, "p2p-send", d, str(i)] + args for i in range(len(trainers))]
            try:
                r = run_all(cmds, timeout=240)
                s["p2p"][f"{scheme}{'-' + provider if provider else ''}"] = gbps(r[0]["bytes"], r[0]["seconds"])
            except Exception as e:  # a provider missing on this host is a finding, not a crash
                log(f"p2p {scheme} {provider}: {e}")
    # Broadcast: NCCL across the instance's GPUs, one process each.
    with tempfile.TemporaryDirectory() as d:
        r = run_all([[bench, "bcast", d, str(k), str(len(instance)), str(g), str(STAGE_BYTES), str(CHUNK), str(DEPTH_STAGE)]
                     for k, g in enumerate(instance)])
        root = [x for x in r if x["rank"] == 0][0]
        s["broadcast"] = gbps(root["bytes"], max(x["end"] for x in r) - root["start"])
        s["broadcast_first_seconds"] = max(x["first_seconds"] for x in r)
    raw["stages"][name] = s
    log(f"{name} stages alone (GB/s): {json.dumps(s)}")
    return s


def job(name, trainers, instance, depth, scheme, provider):
    cmd = [ferry, "local", "--gpus", "--trainers", str(len(trainers)), "--instances", "1", "--workers", str(len(instance)),
           "--chunk-bytes", str(CHUNK), "--depth", str(depth), "--versions", str(VERSIONS), "--no-checksums",
           "--no-verify", "--transport", scheme, "--json", "--timeout", "400"]
    cmd += ["--model-bytes", str(2 * GiB)] if quick else ["--model", "llama3-8b"]
    if provider:
        cmd += ["--fabric-provider", provider]
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
           "stall_s": statistics.median([x["stall_seconds"] for x in timed]) if timed else float("nan")}
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


only = os.environ.get("GPU_BENCH_ONLY", "")  # e.g. "A" or "A:1,2,4,8;B:1,4"
if only:
    picked = {}
    for part in only.split(";"):
        n, _, ds = part.partition(":")
        picked[n] = [int(x) for x in ds.split(",")] if ds else DEPTHS
    SCENARIOS = {n: SCENARIOS[n] for n in picked}
else:
    picked = {n: DEPTHS for n in SCENARIOS}

tables = []
for name, (trainers, instance) in SCENARIOS.items():
    DEPTHS = picked[name]
    s = stages(name, trainers, instance)
    best_p2p = max(s["p2p"].items(), key=lambda kv: kv[1]) if s["p2p"] else ("tcp", float("nan"))
    scheme, provider = ("fabric", "shm") if best_p2p[0] == "fabric-shm" else ("tcp", "")
    for d in DEPTHS:
        job(name, trainers, instance, d, scheme, provider)
    jobs = raw["jobs"][name]
    model = max(j["model_bytes"] for j in jobs.values()) or STAGE_BYTES
    stage_rates = {"D2H": s["d2h"], f"P2P ({best_p2p[0]})": best_p2p[1], "H2D": s["h2d"], "broadcast": s["broadcast"]}
    slow_name, slow = min(stage_rates.items(), key=lambda kv: kv[1])
    slow_s = model / slow / 1e9
    best_d = min(jobs, key=lambda d: jobs[d]["update_s"])
    t = [f"### {name}: trainers on GPUs {trainers}, instance on GPUs {instance}", "",
         "| stage alone | GB/s |", "| --- | ---: |"]
    t += [f"| {k} | {v:.1f} |" for k, v in stage_rates.items()]
    t += [f"| P2P {k} (also measured) | {v:.1f} |" for k, v in s["p2p"].items() if k != best_p2p[0]]
    t += ["", f"slowest stage: {slow_name}; model {model / 1e9:.2f} GB; jobs over {best_p2p[0]}", "",
          "| depth | whole update / slowest stage | trainer stall / whole update | update GB/s | depth-1 / this depth | rollout GPUs verified |",
          "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for d in DEPTHS:
        j = jobs[d]
        t.append(f"| {d} | {j['update_s'] / slow_s:.2f} | {j['stall_s'] / j['update_s']:.2f} | {model / j['update_s'] / 1e9:.1f} | "
                 f"{jobs[DEPTHS[0]]['update_s'] / j['update_s']:.2f} | {j['gpus_verified']}/{len(instance)} |")
    t += ["", f"depth-1 / best depth ({best_d}): {jobs[DEPTHS[0]]['update_s'] / jobs[best_d]['update_s']:.2f}; "
          f"stall at best depth / D2H alone: {jobs[best_d]['stall_s'] / (model / s['d2h'] / 1e9):.2f}", ""]
    tables.append("\n".join(t))

os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, "gpu.json"), "w") as f:
    json.dump(raw, f, indent=1)
with open(os.path.join(out_dir, "gpu_tables.md"), "w") as f:
    f.write("\n".join(tables))
print("\n".join(tables))
