#!/usr/bin/env python3
"""ferry.verl against a peer with verl's nccl backend logic, on the same ranks and tensors,
alternating in one run. Prints a markdown table; writes OUT_DIR/verl_peer.json and .md.

  verl_peer_bench.py OUT_DIR [--model-gib 8] [--rollouts 1] [--bucket-mib 512] [--rounds 3] [--syncs 3]

One trainer rank and ROLLOUTS rollout ranks (one replica each), each a process of its own, driven
over pipes in verl's call order (prepare, build_topology, init_process_group, send_weights beside
receive_weights, finalize). The trainer's table is Llama-shaped bf16 tensors on its GPU (cuda:0;
rollout r on cuda:(r + 1) mod GPUs), new values every sync; each rollout rank checks the first
bytes of every tensor it is yielded. Jobs:
- ferry.verl: rollouts receive on their GPU (engine_kwargs device);
- the peer, written after verl/checkpoint_engine/nccl (read, not copied): trainer rank 0 packs
  tensors into one of two device buckets, broadcasts each full bucket over torch.distributed
  (NCCL; gloo without GPUs) to every rollout rank while it packs the next, the bucket's table
  first; receivers yield views of the bucket. It needs one GPU per rank: left out on one GPU;
- on one GPU, the reference is a D2H and an H2D of the same bytes through pinned memory.
Each sync is timed whole (prepare .. finalize), and the trainer's blocked time is until its
send_weights returns. Sync 1 of each job is set-up; the later ones are timed (median)."""
import argparse
import asyncio
import json
import multiprocessing
import multiprocessing.connection
import os
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python", "verl_standin"))


def table(model_bytes: int) -> list[tuple[str, tuple[int, ...]]]:
    """Llama-like bf16 tensors (4096 wide) summing to about `model_bytes`."""
    layer = [("attn.qkv", (6144, 4096)), ("attn.o", (4096, 4096)), ("mlp.up", (28672, 4096)),
             ("mlp.down", (4096, 14336)), ("norm", (4096,))]
    per_layer = sum(2 * _numel(s) for _, s in layer)
    names = [("embed_tokens", (32000, 4096))]
    for i in range(max(1, (model_bytes - 2 * 2 * 32000 * 4096) // per_layer)):
        names += [(f"layers.{i}.{n}", s) for n, s in layer]
    return names + [("lm_head", (32000, 4096))]


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def rank_main(role: str, index: int, conn, cfg: dict) -> None:
    import torch

    gpus = torch.cuda.device_count()
    device = torch.device("cuda", (0 if role == "trainer" else index + 1) % gpus) if gpus else torch.device("cpu")
    if gpus:
        torch.cuda.set_device(device)
    weights = {n: torch.empty(s, dtype=torch.bfloat16, device=device) for n, s in table(cfg["model_bytes"])} \
        if role == "trainer" else {}

    def generator(step: int):
        for i, (name, t) in enumerate(weights.items()):
            t.view(torch.int16).fill_(step * 1000 + i % 1000)  # the trainer's step writes them
            yield name, t

    def check(step: int, i: int, name: str, t) -> int:
        if int(t.reshape(-1)[:1].view(torch.int16).item()) != step * 1000 + i % 1000:
            raise AssertionError(f"sync {step}: tensor '{name}' holds other bytes")
        return t.numel() * t.element_size()

    ferry_engine, peer = None, None
    while True:
        command, request = conn.recv()
        try:
            if command == "ferry_call":
                if ferry_engine is None:
                    import ferry.verl
                    kwargs = {"replica_size": 1, "timeout": 600.0}
                    if role == "rollout":
                        kwargs["device"] = str(device) if gpus else None
                    ferry_engine = ferry.verl.FerryCheckpointEngine(cfg["bucket_bytes"], is_master=role == "trainer",
                                                                    **kwargs)
                result = getattr(ferry_engine, request["method"])(**request.get("kwargs", {}))
            elif command == "ferry_send":
                start = time.perf_counter()
                asyncio.run(ferry_engine.send_weights(generator(request["step"]), global_steps=request["step"]))
                result = time.perf_counter() - start
            elif command == "ferry_receive":
                async def receive(step):
                    return sum([check(step, i, n, t) async for i, (n, t) in _enumerate(
                        ferry_engine.receive_weights(global_steps=step))])
                result = asyncio.run(receive(request["step"]))
            elif command == "peer_init":
                peer = Peer(role, index, request["world"], request["address"], device, cfg["bucket_bytes"])
                result = None
            elif command == "peer_send":
                start = time.perf_counter()
                peer.send(generator(request["step"]))
                result = time.perf_counter() - start
            elif command == "peer_receive":
                result = sum(check(request["step"], i, n, t) for i, (n, t) in enumerate(peer.receive()))
            elif command == "copy_through_host":
                result = copy_through_host(weights, device)
            else:
                for m in (ferry_engine, peer):
                    if m is not None:
                        m.close()
                conn.send(("ok", None))
                return
            conn.send(("ok", result))
        except Exception as e:  # the driver reports it
            conn.send(("error", f"{role} {index}: {type(e).__name__}: {e}"))


async def _enumerate(agen):
    i = 0
    async for item in agen:
        yield i, item
        i += 1


class Peer:
    """verl's nccl backend logic: rank 0 (the trainer) broadcasts double-buffered buckets of
    packed tensors to every rollout rank; each bucket's table goes first."""

    def __init__(self, role: str, index: int, world: int, address: str, device, bucket_bytes: int):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.device = torch, dist, device
        rank = 0 if role == "trainer" else index + 1
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=address, rank=rank,
                                world_size=world)
        self.buckets = [torch.empty(bucket_bytes, dtype=torch.uint8, device=device) for _ in range(2)]

    def _broadcast(self, bucket, meta) -> list:
        box = [meta]
        self.dist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        self.dist.broadcast(bucket, src=0)
        return box[0]

    def send(self, weights) -> None:
        torch, which, offset, meta = self.torch, 0, 0, []
        for name, t in weights:
            nbytes = t.numel() * t.element_size()
            if offset + nbytes > self.buckets[which].numel():
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                self._broadcast(self.buckets[which], {"tensors": meta, "last": False})
                which, offset, meta = 1 - which, 0, []
            if nbytes > self.buckets[which].numel():
                raise ValueError(f"tensor '{name}' ({nbytes} bytes) does not fit a bucket")
            self.buckets[which][offset:offset + nbytes].copy_(t.reshape(-1).view(torch.uint8), non_blocking=True)
            meta.append((name, t.dtype, tuple(t.shape), offset))
            offset += nbytes
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self._broadcast(self.buckets[which], {"tensors": meta, "last": True})

    def receive(self):
        which = 0
        while True:
            bucket = self.buckets[which]
            meta = self._broadcast(bucket, None)
            for name, dtype, shape, offset in meta["tensors"]:
                nbytes = _numel(shape) * self.torch.empty((), dtype=dtype).element_size()
                yield name, bucket[offset:offset + nbytes].view(dtype).view(shape)
            if meta["last"]:
                return
            which = 1 - which

    def close(self) -> None:
        self.dist.destroy_process_group()


def copy_through_host(weights: dict, device) -> float:
    """A D2H and an H2D of every tensor through one pinned buffer per tensor, timed (seconds)."""
    import torch

    host = {n: torch.empty_like(t, device="cpu", pin_memory=device.type == "cuda") for n, t in weights.items()}
    back = {n: torch.empty_like(t) for n, t in weights.items()}
    times = []
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for n, t in weights.items():
            host[n].copy_(t, non_blocking=True)
        for n, t in back.items():
            t.copy_(host[n], non_blocking=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


class Rank:
    def __init__(self, ctx, role: str, index: int, cfg: dict):
        self.role, self.index = role, index
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=rank_main, args=(role, index, child, cfg), daemon=True)
        self.process.start()

    def ask(self, command: str, **request) -> None:
        self.conn.send((command, request))

    def answer(self):
        status, result = self.conn.recv()
        if status != "ok":
            raise SystemExit(f"FAIL: {result}")
        return result


def answers(ranks: list[Rank]) -> list:
    """Every rank's answer, in order; the first error ends the run (the others may wait forever
    in a collective for the rank that failed)."""
    pending = {r.conn: r for r in ranks}
    while pending:
        for conn in multiprocessing.connection.wait(list(pending)):
            status, result = conn.recv()
            if status != "ok":
                raise SystemExit(f"FAIL: {result}")
            pending.pop(conn).result = result
    return [r.result for r in ranks]


def ferry_sync(engine_class, trainer: Rank, rollouts: list[Rank], step: int) -> dict:
    start = time.perf_counter()
    for r in [trainer, *rollouts]:
        r.ask("ferry_call", method="prepare")
    metadata = [r.answer() for r in [trainer, *rollouts]]
    trainer_kwargs, rollout_kwargs = engine_class.build_topology(1, len(rollouts), metadata)
    trainer.ask("ferry_call", method="init_process_group", kwargs={k: v[0] for k, v in trainer_kwargs.items()})
    for i, r in enumerate(rollouts):
        r.ask("ferry_call", method="init_process_group", kwargs={k: v[i] for k, v in rollout_kwargs.items()})
    for r in [trainer, *rollouts]:
        r.answer()
    for r in rollouts:
        r.ask("ferry_receive", step=step)
    trainer.ask("ferry_send", step=step)
    blocked, *received = answers([trainer, *rollouts])
    for r in [trainer, *rollouts]:
        r.ask("ferry_call", method="finalize")
    for r in [trainer, *rollouts]:
        r.answer()
    return {"sync_s": time.perf_counter() - start, "blocked_s": blocked, "bytes": received}


def peer_sync(trainer: Rank, rollouts: list[Rank], step: int) -> dict:
    start = time.perf_counter()
    for r in rollouts:
        r.ask("peer_receive", step=step)
    trainer.ask("peer_send", step=step)
    blocked, *received = answers([trainer, *rollouts])
    return {"sync_s": time.perf_counter() - start, "blocked_s": blocked, "bytes": received}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--model-gib", type=float, default=8.0)
    parser.add_argument("--rollouts", type=int, default=1)
    parser.add_argument("--bucket-mib", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--syncs", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("FERRY_LOG", "warn")
    import torch
    import ferry.verl

    gpus = torch.cuda.device_count()
    cfg = {"model_bytes": int(args.model_gib * (1 << 30)), "bucket_bytes": args.bucket_mib << 20}
    ctx = multiprocessing.get_context("spawn")
    trainer = Rank(ctx, "trainer", 0, cfg)
    rollouts = [Rank(ctx, "rollout", i, cfg) for i in range(args.rollouts)]
    with_peer = gpus == 0 or gpus > args.rollouts  # NCCL: one rank per GPU
    if with_peer:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        for r in [trainer, *rollouts]:
            r.ask("peer_init", world=1 + args.rollouts, address=address)
        answers([trainer, *rollouts])
    jobs = {"ferry.verl": [], "verl nccl-backend logic": []} if with_peer else {"ferry.verl": []}
    step = 0
    for _ in range(args.rounds):
        for job in jobs:
            runs = []
            for _ in range(args.syncs):
                step += 1
                run = ferry_sync(ferry.verl.FerryCheckpointEngine, trainer, rollouts, step) if job == "ferry.verl" \
                    else peer_sync(trainer, rollouts, step)
                runs.append(run)
                print(f"{job} sync {step}: {run['sync_s']:.4f} s, trainer blocked {run['blocked_s']:.4f} s",
                      flush=True)
            jobs[job].append(runs[1:] or runs)
    reference = None
    if gpus == 1:
        trainer.ask("copy_through_host")
        reference = trainer.answer()
    for r in [trainer, *rollouts]:
        r.ask("close")
        r.answer()
    model_bytes = sum(2 * _numel(s) for _, s in table(cfg["model_bytes"]))
    summary = {job: {"sync_s": statistics.median(x["sync_s"] for runs in rounds for x in runs),
                     "blocked_s": statistics.median(x["blocked_s"] for runs in rounds for x in runs)}
               for job, rounds in jobs.items()}
    base = summary.get("verl nccl-backend logic")
    lines = [f"1 trainer rank -> {args.rollouts} rollout rank(s), {gpus} GPU(s), {model_bytes / 1e9:.2f} GB bf16, "
             f"bucket {args.bucket_mib} MiB, {args.rounds} rounds of {args.syncs} syncs (median of syncs 2..)", "",
             "| job | sync s | trainer blocked s | sync: peer / this | blocked: this / peer |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for job, s in summary.items():
        vs = f"{base['sync_s'] / s['sync_s']:.2f} | {s['blocked_s'] / base['blocked_s']:.2f}" if base else " | "
        lines.append(f"| {job} | {s['sync_s']:.4f} | {s['blocked_s']:.4f} | {vs} |")
    if reference is not None:
        lines += ["", f"D2H + H2D of the same bytes through pinned memory on the GPU: {reference:.4f} s; "
                  f"ferry.verl's sync / that: {summary['ferry.verl']['sync_s'] / reference:.2f}"]
    table_md = "\n".join(lines) + "\n"
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "verl_peer.md"), "w") as f:
        f.write(table_md)
    with open(os.path.join(args.out_dir, "verl_peer.json"), "w") as f:
        json.dump({"args": vars(args), "gpus": gpus, "jobs": jobs, "summary": summary,
                   "copy_through_host_s": reference}, f, indent=1)
    print(table_md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
