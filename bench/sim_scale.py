#!/usr/bin/env python3
"""How `ferry sim`'s wall time and memory grow with the cluster: Kimi-K2 FP8 (kimi-k2*.toml), the
trainers and the instances of 16 scaled together, from 64 to 384 GPUs.

  python3 bench/sim_scale.py build/cli/ferry            prints the markdown table
  python3 bench/sim_scale.py build/cli/ferry --steady   the steady state: each size run for 1 and
                                                        for 3 versions; the extra versions' events
                                                        over their wall time, set-up excluded
  python3 bench/sim_scale.py NEW --against OLD [--rounds 3] [--gpus 384] [--scenario kimi-k2-ep16]
                                                        two binaries' steady state, run alternately
                                                        (1 and 9 versions; 1 and 3 at 384 GPUs) so
                                                        that both see the same VM, the first one
                                                        swapped every round: per round with its
                                                        ratio, then the medians
  ... --against OLD --cpu                               the same in CPU time (user and system) of
                                                        the runs, which the VM's host moves less
  ... --against OLD --in-run                            the same timed inside the longer run alone
                                                        (its first version's delivery to its last):
                                                        one run's noise instead of two runs'
  ... --against OLD --side-by-side                      timed inside the run, both binaries at once,
                                                        one per core: the steadiest comparison here
                                                        (its rounds' ratios within 10% of each
                                                        other, where alternating runs spread over
                                                        30%)
  ... --against OLD --side-by-side --whole              the same for whole one-version runs, set-up
                                                        included: what `ferry sim SCENARIO` costs
"""
import json
import resource
import statistics
import subprocess
import sys

# (trainer GPUs, instances of 16)
SIZES = [(32, 2), (64, 4), (128, 4), (256, 8)]

ferry = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else "build/cli/ferry"
steady = "--steady" in sys.argv


def flag(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def command(scenario, trainers, instances, versions, binary):
    return [binary or ferry, "sim", f"examples/sim/{scenario}.toml", "--json", "--set", f"versions={versions}",
            "--set", f"placement.trainers={trainers}", "--set", f"placement.instances={instances}"]


def parsed(out):
    r = json.loads(out)
    assert r["delivered"], r["error"]
    return r


def run(scenario, trainers, instances, versions=1, binary=None):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(command(scenario, trainers, instances, versions, binary), capture_output=True, text=True,
                         check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = parsed(out)
    r["cpu_seconds"] = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return r


def timed_inside(r, versions):
    """Seconds and events per version beyond the first, as the run timed them itself (from the
    first version's delivery to the last's)."""
    if "steady_wall_seconds" not in r:
        sys.exit("timing inside the run: the binary must report steady_wall_seconds (ferry sim --json, 2026-11-28 on)")
    return r["steady_wall_seconds"] / (versions - 1), r["steady_events"] / (versions - 1)


def whole_run(r, versions):
    """Seconds and events of the whole run, set-up included."""
    return r["wall_seconds"], r["chunk_stage_events"]


def side_by_side(scenario, trainers, instances, versions, binaries, reading=timed_inside):
    """`reading` of each binary's run, all run at once (one per core): they share the same minutes
    of the VM, whose speed moved 2.4x within an hour, and its caches, evenly."""
    running = [subprocess.Popen(command(scenario, trainers, instances, versions, b), stdout=subprocess.PIPE, text=True)
               for b in binaries]
    return [reading(parsed(p.communicate()[0]), versions) for p in running]


def steady_state(scenario, trainers, instances, versions, binary=None, timed_by="wall_seconds"):
    """Seconds per version and events per version beyond the first (the set-up is in both runs),
    and the one-version run."""
    one, many = run(scenario, trainers, instances, 1, binary), run(scenario, trainers, instances, versions, binary)
    per_version = (many[timed_by] - one[timed_by]) / (versions - 1)
    events = (many["chunk_stage_events"] - one["chunk_stage_events"]) / (versions - 1)
    return per_version, events, one, many


if "--against" in sys.argv:
    old, rounds, gpus = flag("--against", None), int(flag("--rounds", "3")), flag("--gpus", "64")
    timed_by = "cpu_seconds" if "--cpu" in sys.argv else "wall_seconds"
    in_one_run = "--in-run" in sys.argv
    together = "--side-by-side" in sys.argv
    whole = "--whole" in sys.argv
    if whole and not together:
        sys.exit("--whole: with --side-by-side")
    scenario = flag("--scenario", "kimi-k2")
    if gpus not in ("64", "384"):
        sys.exit("--gpus: 64 or 384")
    if scenario not in ("kimi-k2", "kimi-k2-ep16"):
        sys.exit("--scenario: kimi-k2 or kimi-k2-ep16")
    trainers, instances = SIZES[0] if gpus == "64" else SIZES[-1]
    versions = 1 if whole else 9 if gpus == "64" else 3  # a version at 384 GPUs takes 16 s
    clock = "CPU s" if timed_by == "cpu_seconds" else "s"
    per = "per run" if whole else "per version"
    how = "whole runs of" if whole else "timed inside runs of" if in_one_run or together else "runs of 1 and"
    print(f"{scenario}, {trainers + 16 * instances} GPUs, {how} {versions} version{'s' if versions > 1 else ''}"
          f"{', side by side' if together else ''}\n")
    print(f"| round | {clock} {per}, {old} | {clock} {per}, {ferry} | events/s, old | events/s, new | new / old |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    results = []  # per round: (old, new), each (s per version, events/s)
    for r in range(1, rounds + 1):
        # The VM's speed drifts within minutes: whichever runs first must not always be the same one.
        order = (old, ferry) if r % 2 else (ferry, old)
        if together:
            timed = side_by_side(scenario, trainers, instances, versions, order, whole_run if whole else timed_inside)
        elif in_one_run:
            # One run's noise, not the difference of two runs'.
            timed = [timed_inside(run(scenario, trainers, instances, versions, b), versions) for b in order]
        else:
            timed = [steady_state(scenario, trainers, instances, versions, b, timed_by)[:2] for b in order]
        measured = {b: (per_version, events / per_version) for b, (per_version, events) in zip(order, timed)}
        pair = [measured[old], measured[ferry]]
        results.append(pair)
        (before, before_rate), (after, after_rate) = pair
        print(f"| {r} | {before:.4f} | {after:.4f} | {before_rate:,.0f} | {after_rate:,.0f} | {after / before:.3f} |",
              flush=True)
    medians = [[statistics.median(p[i][k] for p in results) for k in (0, 1)] for i in (0, 1)]
    ratio = statistics.median(p[1][0] / p[0][0] for p in results)
    print(f"| median | {medians[0][0]:.4f} | {medians[1][0]:.4f} | {medians[0][1]:,.0f} | {medians[1][1]:,.0f} | "
          f"{ratio:.3f} |")
    print(f"\nnew / old, time {per}: {medians[1][0] / medians[0][0]:.3f} (medians), "
          f"{ratio:.3f} (median of the rounds' ratios)")
    sys.exit(0)

if steady:
    print("| scenario | GPUs | wall s, 1 version | wall s, 3 versions | s per extra version | events per version | "
          "steady events/s | the same, timed in the 3-version run | set-up s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for scenario in ["kimi-k2", "kimi-k2-ep16"]:
        for trainers, instances in [SIZES[0], SIZES[-1]]:
            per_version, events, one, many = steady_state(scenario, trainers, instances, 3)
            print(f"| {scenario} | {trainers + 16 * instances} | {one['wall_seconds']:.2f} | "
                  f"{many['wall_seconds']:.2f} | {per_version:.3f} | {events:,.0f} | "
                  f"{events / per_version:,.0f} | {many['steady_events_per_second']:,.0f} | "
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
