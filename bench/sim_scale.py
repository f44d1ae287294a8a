#!/usr/bin/env python3
"""How `ferry sim`'s wall time and memory grow with the cluster: Kimi-K2 FP8 (kimi-k2*.toml), the
trainers and the instances of 16 scaled together, from 64 to 384 GPUs.

  python3 bench/sim_scale.py build/cli/ferry     prints the markdown table
"""
import json
import subprocess
import sys

# (trainer GPUs, instances of 16)
SIZES = [(32, 2), (64, 4), (128, 4), (256, 8)]

ferry = sys.argv[1] if len(sys.argv) > 1 else "build/cli/ferry"
print("| scenario | GPUs | actors | predicted s | bound s | transfers | chunk-stage events | wall s | events/s | "
      "peak RSS MiB |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for scenario in ["kimi-k2-ep16", "kimi-k2"]:
    for trainers, instances in SIZES:
        out = subprocess.run([ferry, "sim", f"examples/sim/{scenario}.toml", "--json",
                              "--set", f"placement.trainers={trainers}", "--set", f"placement.instances={instances}"],
                             capture_output=True, text=True, check=True).stdout
        r = json.loads(out)
        assert r["delivered"], r["error"]
        print(f"| {scenario} | {trainers + 16 * instances} | {r['actors']} | {r['predicted_seconds']:.3f} | "
              f"{r['bound_seconds']:.3f} | {r['transfers']} | {r['chunk_stage_events']} | {r['wall_seconds']:.1f} | "
              f"{r['events_per_second']:.0f} | {r['peak_rss_mib']:.0f} |", flush=True)
