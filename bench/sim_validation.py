#!/usr/bin/env python3
"""Predicted (ferry sim) against measured (bench/results/gpu.md) whole updates, per layout and depth.

  python3 bench/sim_validation.py build/cli/ferry     prints the markdown table
"""
import json
import subprocess
import sys

# Whole update, version 2, seconds (bench/results/gpu.md): run 1 per-layout tables, run 2 where noted.
MEASURED = {
    "A1": {1: (0.850, "run 1"), 2: (0.422, "run 1"), 4: (0.455, "run 2"), 8: (0.481, "run 2")},
    "A3": {1: (0.791, ""), 2: (0.392, ""), 4: (0.407, ""), 8: (0.394, "")},
    "B1": {1: (0.509, "run 1"), 2: (0.428, "run 1"), 4: (0.476, "run 2"), 8: (0.510, "run 2")},
    "B2": {1: (0.499, ""), 2: (0.321, ""), 4: (0.289, ""), 8: (0.338, "")},
    "P": {1: (0.791, ""), 2: (0.440, ""), 4: (0.496, ""), 8: (0.528, "")},
    "H2": {2: (0.473, "best of run 3")},
    # gpu_h200x2_shared.json
    "Ps": {1: (0.448, "run 2"), 2: (0.387, "run 2"), 4: (0.397, "run 2")},
    "H2s": {2: (0.393, "run 3"), 4: (0.427, "run 3")},
}

ferry = sys.argv[1] if len(sys.argv) > 1 else "build/cli/ferry"
print("| layout | depth | predicted s | measured s | error | bound s | bottleneck | note |")
print("| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |")
for layout, depths in MEASURED.items():
    for depth, (measured, note) in depths.items():
        out = subprocess.run([ferry, "sim", f"examples/sim/{layout}.toml", "--set", f"depth={depth}", "--json"],
                             capture_output=True, text=True, check=True).stdout
        r = json.loads(out)
        error = (r["predicted_seconds"] - measured) / measured
        flag = " **miss**" if abs(error) > 0.15 else ""
        print(f"| {layout} | {depth} | {r['predicted_seconds']:.3f} | {measured:.3f} | {100 * error:+.0f}%{flag} | "
              f"{r['bound_seconds']:.3f} | {r['bottleneck']} | {note} |")
