#!/usr/bin/env python3
"""How `ferry sim`'s wall time and memory grow with the cluster: Kimi-K2 FP8 (kimi-k2*.toml), the
trainers and the instances of 16 scaled together, from 64 to 384 GPUs.

  python3 bench/sim_scale.py build/cli/ferry            prints the markdown table
  python3 bench/sim_scale.py build/cli/ferry --steady   the steady state: each size run for 1 and
                                                        for 3 versions; the extra versions' events
                                                        over their wall time, set-up excluded
"""
import json
import subprocess
import sys

# (trainer GPUs, instances of 16)
SIZES = [(32, 2), (64, 4), (128, 4), (256, 8)]

ferry = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else "build/cli/ferry"
steady = "--steady" in sys.argv


def run(scenario, trainers, instances, versions=1):
    out = subprocess.run([ferry, "sim", f"examples/sim/{scenario}.toml", "--json", "--set", f"versions={versions}",
                          "--set", f"placement.trainers={trainers}", "--set", f"placement.instances={instances}"],
                         capture_output=True, text=True, check=True).stdout
    r = json.loads(out)
    assert r["delivered"], r["error"]
    return r


if steady:
    print("| scenario | GPUs | wall s, 1 version | wall s, 3 versions | s per extra version | events per version | "
          "steady events/s | set-up s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for scenario in ["kimi-k2", "kimi-k2-ep16"]:
        for trainers, instances in [SIZES[0], SIZES[-1]]:
            one, three = run(scenario, trainers, instances, 1), run(scenario, trainers, instances, 3)
            per_version = (three["wall_seconds"] - one["wall_seconds"]) / 2
            events = (three["chunk_stage_events"] - one["chunk_stage_events"]) / 2
            print(f"| {scenario} | {trainers + 16 * instances} | {one['wall_seconds']:.2f} | "
                  f"{three['wall_seconds']:.2f} | {per_version:.3f} | {events:,.0f} | {events / per_version:,.0f} | "
                  f"{one['wall_seconds'] - per_version:.2f} |", flush=True)
    sys.exit(0)

print("| scenario | GPUs | actors | predicted s | bound s | transfers | chunk-stage events | wall s | events/s | "
      "peak RSS MiB |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for scenario in ["kimi-k2-ep16", "kimi-k2"]:
    for trainers, instances in SIZES:
        r = run(scenario, trainers, instances)
        print(f"| {scenario} | {trainers + 16 * instances} | {r['actors']} | {r['predicted_seconds']:.3f} | "
              f"{r['bound_seconds']:.3f} | {r['transfers']} | {r['chunk_stage_events']} | {r['wall_seconds']:.1f} | "
              f"{r['events_per_second']:.0f} | {r['peak_rss_mib']:.0f} |", flush=True)
