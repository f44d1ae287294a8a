#!/usr/bin/env python3
"""The same job inside ferry (`ferry bench`), through the C++ API (ferry_api_bench), the Python
module, and the verl backend, in one run: one trainer and one instance of rollouts in one process
each, over tcp loopback; each number is the median, over versions 2.., of the time from publish to
every rollout holding the version. The jobs alternate, --rounds times, so drift of the machine hits
each alike.

  python3 bench/python_bench.py --api-bench build/bench/ferry_api_bench [--ferry build/cli/ferry]
      [--model-mib 256] [--verl-model-mib 1024] [--workers 2] [--versions 9] [--rounds 2]
      [--out bench/results/python.md]
Needs PYTHONPATH to hold the built module (build/python).
"""
import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import ferry
import ferry.verl

SECRET = "python-bench-secret-of-enough-byte"


def cpp_job(api_bench: str, model_bytes: int, args, checks: bool = False) -> list[float]:
    out = subprocess.run([api_bench, "--model-bytes", str(model_bytes), "--tensors", str(args.tensors),
                          "--chunk-bytes", str(args.chunk_bytes), "--depth", str(args.depth), "--workers",
                          str(args.workers), "--versions", str(args.versions)] + (["--checks"] if checks else []),
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["per_version_s"]


def internal_job(ferry_cli: str, model_bytes: int, args) -> float:
    """`ferry bench`'s in-process job (actors driven directly, no API), checks off: its median."""
    with tempfile.NamedTemporaryFile(suffix=".csv") as csv:
        subprocess.run([ferry_cli, "bench", "--transports", "tcp", "--depths", str(args.depth), "--chunk-bytes",
                        str(args.chunk_bytes), "--model-bytes", str(model_bytes), "--trainers", "1", "--instances",
                        "1", "--workers", str(args.workers), "--versions", str(args.versions), "--stage-repeats",
                        "1", "--csv", csv.name], check=True, capture_output=True)
        header, row = open(csv.name).read().splitlines()[:2]
        return float(dict(zip(header.split(","), row.split(",")))["median_seconds"])


def python_job(model_bytes: int, args) -> list[float]:
    coordinator = ferry.Coordinator(secret=SECRET, instance_sizes=[args.workers], chunk_bytes=args.chunk_bytes,
                                    depth=args.depth)
    member = {"coordinator": coordinator.address, "secret": SECRET, "checksums": False, "digests": False}
    size = model_bytes // args.tensors
    sent = [torch.ones(size, dtype=torch.uint8) for _ in range(args.tensors)]
    trainer = ferry.Trainer(**member)
    for i, t in enumerate(sent):
        trainer.register(f"t{i}", t)
    rollouts = []
    for rank in range(args.workers):
        r = ferry.Rollout(instance=0, rank=rank, **member)
        for i in range(args.tensors):
            r.register(f"t{i}", torch.zeros(size, dtype=torch.uint8))
        rollouts.append(r)
    trainer.join()
    for r in rollouts:
        r.join()
    times = []
    for version in range(1, args.versions + 1):
        start = time.perf_counter()
        trainer.publish(version).wait_delivered(600)
        for r in rollouts:
            r.wait_version(version, 600)
        times.append(time.perf_counter() - start)
    for m in (trainer, *rollouts, coordinator):
        m.close()
    return times


def verl_job(model_bytes: int, args) -> list[float]:
    """verl's call order, every rank an engine in this process: one trainer rank, one replica."""
    engine = ferry.verl.FerryCheckpointEngine
    options = {"bucket_size": args.chunk_bytes, "chunk_bytes": args.chunk_bytes, "depth": args.depth, "timeout": 600}
    trainer = engine(is_master=True, **options)
    rollouts = [engine(replica_size=args.workers, **options) for _ in range(args.workers)]
    size = model_bytes // args.tensors
    weights = [torch.ones(size, dtype=torch.uint8) for _ in range(args.tensors)]

    def generator():
        yield from ((f"t{i}", t) for i, t in enumerate(weights))

    async def receive(r, step):
        return sum([t.numel() async for _, t in r.receive_weights(global_steps=step)])

    async def sync(step):
        return await asyncio.gather(trainer.send_weights(generator(), global_steps=step),
                                    *[receive(r, step) for r in rollouts])

    times = []
    for step in range(1, args.versions + 1):
        start = time.perf_counter()
        metadata = [trainer.prepare()] + [r.prepare() for r in rollouts]
        trainer_kwargs, rollout_kwargs = engine.build_topology(1, args.workers, metadata)
        trainer.init_process_group(**{k: v[0] for k, v in trainer_kwargs.items()})
        for i, r in enumerate(rollouts):
            r.init_process_group(**{k: v[i] for k, v in rollout_kwargs.items()})
        _, *received = asyncio.run(sync(step))
        for m in (trainer, *rollouts):
            m.finalize()
        assert all(n == size * args.tensors for n in received), received
        times.append(time.perf_counter() - start)
    for m in (*rollouts, trainer):
        m.close()
    return times


def median(times: list[float]) -> float:
    return statistics.median(times[1:])  # version 1 pays for joining and first touches


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--api-bench", required=True)
    parser.add_argument("--ferry", help="the ferry command: adds `ferry bench`'s internal job")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model-mib", type=int, default=256)
    parser.add_argument("--verl-model-mib", type=int, default=1024)
    parser.add_argument("--tensors", type=int, default=64)
    parser.add_argument("--chunk-bytes", type=int, default=4 << 20)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--versions", type=int, default=9)
    parser.add_argument("--out", help="also write the table here (markdown)")
    args = parser.parse_args()
    os.environ.setdefault("FERRY_LOG", "warn")

    model, verl_model = args.model_mib << 20, args.verl_model_mib << 20
    runs = {"internal (ferry bench)": [], "C++ API (ferry_api_bench)": [], "Python module": []}
    for _ in range(args.rounds):  # alternated
        if args.ferry:
            runs["internal (ferry bench)"].append(internal_job(args.ferry, model, args))
        runs["C++ API (ferry_api_bench)"].append(median(cpp_job(args.api_bench, model, args)))
        runs["Python module"].append(median(python_job(model, args)))
    cpp_big = median(cpp_job(args.api_bench, verl_model, args, checks=True))  # the backend's defaults
    verl_big = median(verl_job(verl_model, args))

    reference = statistics.mean(runs["C++ API (ferry_api_bench)"])
    lines = [
        f"One trainer -> 1 instance x {args.workers} rollouts, one process each job, tcp loopback, "
        f"{args.tensors} tensors, chunk {args.chunk_bytes >> 20} MiB, depth {args.depth}, checks off; "
        f"median of versions 2..{args.versions} (publish -> every rollout holds it); {args.rounds} rounds, "
        "the jobs alternating.",
        "",
        "| job | model | " + " | ".join(f"round {i + 1} s" for i in range(args.rounds)) + " | mean s | x C++ API |",
        "| --- | --- | " + " | ".join("---" for _ in range(args.rounds)) + " | --- | --- |",
    ]
    for name, times in runs.items():
        if times:
            mean = statistics.mean(times)
            lines.append(f"| {name} | {args.model_mib} MiB | " + " | ".join(f"{t:.4f}" for t in times) +
                         f" | {mean:.4f} | {mean / reference:.3f} |")
    blank = " | ".join("" for _ in range(args.rounds - 1))
    lines += [
        f"| C++ API, checks on | {args.verl_model_mib} MiB | {cpp_big:.4f} | {blank} | {cpp_big:.4f} | 1.000 |",
        f"| verl backend, whole sync (prepare .. finalize), checks on | {args.verl_model_mib} MiB | {verl_big:.4f} | "
        f"{blank} | {verl_big:.4f} | {verl_big / cpp_big:.3f} |",
        "",
        f"Machine: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}; load {os.getloadavg()[0]:.2f} at the end.",
    ]
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
