#!/usr/bin/python3
"""`ferry sim --sweep` (issue 16): every combination runs, two at a time, each in a process of its
own; the CSV has a row per combination in the sweep's order, a column per swept field, and the
predictions a lone `ferry sim` of the same combination gives; the best combination is named; the
plot's script holds one line per combination of the other axes. A bad sweep is refused before
anything runs.

Usage: sim_sweep.py FERRY_BINARY
"""
import csv
import json
import os
import re
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "integration"))
from job_verdict import check, failures  # noqa: E402

ferry = os.path.abspath(sys.argv[1])
scenario = os.path.join(here, "..", "..", "examples", "sim", "B2.toml")


def lone_prediction(sets):
    args = [ferry, "sim", scenario, "--json"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    check(out.returncode == 0, f"lone run {sets}: exit {out.returncode}: {out.stderr[-500:]}")
    return json.loads(out.stdout)


with tempfile.TemporaryDirectory(prefix="ferry-sweep-") as scratch:
    # A quote and a space in the plot's path: gnuplot and the shell must take it as it is.
    odd = os.path.join(scratch, "o'dd dir")
    os.mkdir(odd)
    table, plot = os.path.join(scratch, "sweep.csv"), os.path.join(odd, "sweep $HOME.png")
    # The third axis has one value: a column of its own, and part of each line's key in the plot.
    run = subprocess.run([ferry, "sim", scenario, "--sweep", "depth=1,2", "stripes=1,2", "hardware.copy_threads=16",
                          "--jobs", "2", "--csv", table, "--plot", plot], capture_output=True, text=True, timeout=300)
    print(run.stdout + run.stderr, flush=True)
    check(run.returncode == 0, f"sweep: exit {run.returncode}")
    check("4 runs of" in run.stderr and "2 at a time" in run.stderr,
          "sweep: no line saying what runs, how many at once")
    check(len(re.findall(r"^\[\d/4\] ", run.stderr, re.M)) == 4, "sweep: not one progress line per run")
    with open(table) as f:
        rows = list(csv.DictReader(f))
    check(list(rows[0].keys())[:4] == ["depth", "chunk_mib", "stripes", "hardware.copy_threads"] if rows else False,
          f"sweep: columns {list(rows[0].keys()) if rows else None}")
    combos = [(d, s) for d in (1, 2) for s in (1, 2)]
    check([(int(r["depth"]), int(r["stripes"])) for r in rows] == combos,
          f"sweep: rows not in the sweep's order: {[(r['depth'], r['stripes']) for r in rows]}")
    for r, (depth, stripes) in zip(rows, combos):
        lone = lone_prediction([f"depth={depth}", f"stripes={stripes}"])
        check(r["predicted_seconds"] == f"{lone['predicted_seconds']:.6f}",
              f"depth {depth} stripes {stripes}: the sweep predicts {r['predicted_seconds']}, "
              f"a lone run {lone['predicted_seconds']:.6f}")
        check(r["bottleneck"] == lone["bottleneck"], f"depth {depth} stripes {stripes}: bottleneck differs")
        check(float(r["predicted_seconds"]) >= float(r["bound_seconds"]) - 1e-6,
              f"depth {depth} stripes {stripes}: beats its bound")
        check(r["hardware.copy_threads"] == "16", "the extra axis' value is not in its column")
    # The combination that delivers soonest is named.
    best = min(rows, key=lambda r: float(r["predicted_seconds"])) if rows else None
    named = re.search(r"^best: depth=(\d+) stripes=(\d+) hardware.copy_threads=16: ([0-9.]+) s", run.stdout, re.M)
    check(best is not None and named is not None and (named[1], named[2]) == (best["depth"], best["stripes"])
          and abs(float(named[3]) - float(best["predicted_seconds"])) < 1e-4,
          f"sweep: the best line {named[0] if named else None!r} is not the row {best}")
    check(os.path.getsize(plot) > 0 if os.path.exists(plot) else False, f"sweep: no plot at {plot!r}")
    check(all(r["delivered"] == "true" for r in rows), "sweep: a row not delivered")
    # One data block per (chunk, stripes, copy_threads), its points in the order of depth.
    with open(plot + ".gp") as f:
        script = f.read()
    blocks = re.findall(r"^(\$line\d+) << EOD\n(.*?)^EOD$", script, re.M | re.S)
    check(len(blocks) == 2, f"plot: {len(blocks)} lines, expected 2 (stripes 1 and 2)")
    for (name, points), stripes in zip(blocks, (1, 2)):
        want = [f"{r['depth']} {r['predicted_seconds']}" for r in rows if int(r["stripes"]) == stripes]
        check(points.split("\n")[:-1] == want, f"plot {name}: points {points!r}, expected {want}")
        check(f"{name} using 1:2 with linespoints title 'chunk MiB,stripes,hardware.copy_threads 64,{stripes},16'"
              in script, f"plot {name}: no plotted line with its key as title")

    # Refused up front, one line naming the culprit, no CSV written.
    os.remove(table)
    for what, args, culprit in [
        ("an axis without values", ["--sweep", "depth"], "--sweep depth"),
        ("an unknown field", ["--sweep", "depth=1,2", "ferry.bogus=1,2"], "ferry.bogus"),
        ("a value the field refuses", ["--sweep", "depth=1,0"], "ferry.depth"),
        ("no jobs", ["--sweep", "depth=1,2", "--jobs", "0"], "--jobs"),
    ]:
        out = subprocess.run([ferry, "sim", scenario, *args, "--csv", table, "--plot", plot], capture_output=True,
                             text=True, timeout=60)
        lines = out.stderr.strip().splitlines()
        check(out.returncode == 2, f"{what}: exit {out.returncode}, expected 2")
        check(len(lines) == 1 and culprit in lines[0], f"{what}: stderr {out.stderr!r} does not name {culprit}")
        check(not os.path.exists(table), f"{what}: a CSV was written")

if failures:
    print(f"{len(failures)} checks FAILED")
    sys.exit(1)
print("ok")
