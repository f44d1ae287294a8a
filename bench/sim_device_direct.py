#!/usr/bin/env python3
"""Device-direct P2P against host staging on one node, as `ferry sim` predicts them, side by side.

  python3 bench/sim_device_direct.py build/cli/ferry     prints the markdown table

examples/sim/one-node-device-direct.toml under ferry.p2p = auto and host, for one leader and for
four, and with hardware.peer_access = false (no GPU reads another's: auto goes through host memory).
"""
import json
import subprocess
import sys

SCENARIO = "examples/sim/one-node-device-direct.toml"
ferry = sys.argv[1] if len(sys.argv) > 1 else "build/cli/ferry"


def predict(sets):
    command = [ferry, "sim", SCENARIO, "--json"] + [a for s in sets for a in ("--set", s)]
    r = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    assert r["delivered"], r["error"]
    return r


def carried(r, words):
    """GB that the resources whose names hold one of `words` carried over the run (both versions;
    each NVLink byte on its tx and its rx, each memcpy byte read and written)."""
    return sum(u["bytes"] for u in r["resources"] if any(w in u["name"] for w in words)) / 1e9


print("| stripes | peer access | p2p | predicted s | stall s | bound s | bottleneck | NVLink GB (tx+rx) | "
      "PCIe GB (D2H+H2D) | host memory GB | host / auto |")
print("| ---: | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
for stripes, peers in [(1, "true"), (4, "true"), (4, "false")]:
    runs = {p2p: predict([f"stripes={stripes}", f"p2p={p2p}", f"hardware.peer_access={peers}"])
            for p2p in ("auto", "host")}
    for p2p, r in runs.items():
        speedup = f"x{runs['host']['predicted_seconds'] / r['predicted_seconds']:.2f}" if p2p == "auto" else ""
        print(f"| {stripes} | {peers} | {p2p} | {r['predicted_seconds']:.4f} | {r['stall_seconds']:.4f} | "
              f"{r['bound_seconds']:.4f} | {r['bottleneck']} | {carried(r, ['nvlink']):.2f} | "
              f"{carried(r, ['pcie h2d', 'pcie d2h']):.2f} | {carried(r, ['memory']):.2f} | {speedup} |")
