"""ferry's verl backend in a real multi-process job, driven in exactly verl's call order (verl's
CheckpointEngineManager.update_weights) with the stand-in for verl's base module beside this file.

Processes: 2 trainer ranks (the coordinator inside rank 0) and 2 replicas of 2 rollout ranks (of 1
with --replica-size 1: on one GPU, whose NCCL takes one rank of a replica), each a process of its
own, driven over pipes as verl's Ray workers are. Syncs:
  1, 2   every rollout rank gets every tensor equal to the trainers';
  3      replica 1's first rollout rank was killed (SIGKILL) and replaced by a new process, which
         the job catches up with version 2 before the trainers send version 3;
  4      trainer rank 1 kills itself (SIGKILL) halfway through its generator: every other rank's
         call raises within BOUND seconds, none hangs;
  5      a new trainer rank 1 takes its place and the sync delivers again;
  6      trainer rank 1 is killed after init_process_group, before it sends: rank 0 publishes without
         it, and every other rank's call raises (at the engine's timeout: a rank that comes back
         could still publish that version);
  7      a new trainer rank 1 publishes the next version, which is delivered (the one it skipped
         fails for good).
With --without-global-steps no call passes global_steps (verl's manager before #6507, and its own
tests): every sync still yields the bytes the trainers send in that sync, on replaced ranks too.
Usage: verl_job.py [--device cuda] [--replica-size N] [--megabytes N] [--without-global-steps]
"""
import argparse
import asyncio
import multiprocessing
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINERS, REPLICAS = 2, 2
BOUND = 60  # seconds any rank may take to answer before the job counts as hung
ENGINE_KWARGS = {"chunk_bytes": 256 << 10, "timeout": 10.0}


def model(step: int, megabytes: float, device: str):
    """verl's per-tensor generator: the same full table on every trainer rank, new values per step."""
    import torch

    g = torch.Generator().manual_seed(step)
    scale = max(1, int(megabytes * (1 << 20) / 1_100_000))
    shapes = [("embed_tokens.weight", (250 * scale, 512), torch.bfloat16)]
    for layer in range(4):
        shapes += [(f"layers.{layer}.attn.qkv.weight", (96 * scale, 512), torch.bfloat16),
                   (f"layers.{layer}.mlp.up.weight", (64 * scale, 513), torch.float32),
                   (f"layers.{layer}.norm.weight", (513,), torch.float16)]
    shapes.append(("lm_head.steps", (1000,), torch.int64))
    for name, shape, dtype in shapes:
        t = (torch.randn(shape, generator=g) * 10).to(dtype) if dtype != torch.int64 else torch.arange(1000) * step
        yield name, t.to(device)


def member(role: str, is_master: bool, conn, args: argparse.Namespace) -> None:
    sys.path.insert(0, os.path.join(HERE, "verl_standin"))
    import torch
    import ferry.verl  # noqa: F401  (registers "ferry")
    from verl.checkpoint_engine.base import CheckpointEngineRegistry

    device, megabytes, with_steps = args.device, args.megabytes, not args.without_global_steps
    # A trainer's tensors live on `device`; a rollout rank gets its tensors there.
    engine = CheckpointEngineRegistry.new("ferry", bucket_size=512 << 20, is_master=is_master, **ENGINE_KWARGS,
                                          replica_size=args.replica_size,
                                          **({"device": device} if role == "rollout" and device != "cpu" else {}))

    def dying(weights, after: int):
        for index, item in enumerate(weights):
            if index == after:
                os.kill(os.getpid(), signal.SIGKILL)
            yield item

    async def receive(step: int) -> dict:
        start, first, count = time.perf_counter(), None, 0
        expected = dict(model(step, megabytes, "cpu"))
        async for name, tensor in engine.receive_weights(global_steps=step if with_steps else None):
            first = first or time.perf_counter() - start
            want = expected.pop(name)
            if tensor.device.type != torch.device(device).type:
                raise AssertionError(f"step {step}: tensor '{name}' arrived on {tensor.device}, not {device}")
            if tensor.dtype != want.dtype or not torch.equal(tensor.cpu(), want):
                raise AssertionError(f"step {step}: tensor '{name}' differs from the trainers'")
            count += 1
        if expected:
            raise AssertionError(f"step {step}: never received {sorted(expected)}")
        return {"tensors": count, "first_tensor_s": first, "all_s": time.perf_counter() - start}

    while True:
        command, request = conn.recv()
        try:
            if command == "call":
                result = getattr(engine, request["method"])(**request.get("kwargs", {}))
            elif command == "send":
                weights = model(request["step"], megabytes, device)
                if request.get("die_after") is not None:
                    weights = dying(weights, request["die_after"])
                result = asyncio.run(engine.send_weights(weights, global_steps=request["step"] if with_steps else None))
            elif command == "receive":
                result = asyncio.run(receive(request["step"]))
            else:
                engine.close()
                conn.send(("ok", None))
                return
            conn.send(("ok", result))
        except Exception as e:  # the driver reports it
            conn.send(("error", f"{type(e).__name__}: {e}"))


class Rank:
    def __init__(self, ctx, role: str, is_master: bool, args: argparse.Namespace):
        self.role = role
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=member, args=(role, is_master, child, args), daemon=True)
        self.process.start()

    def ask(self, command: str, **args) -> None:
        self.conn.send((command, args))

    def answer(self) -> tuple[str, object]:
        if not self.conn.poll(BOUND):
            raise SystemExit(f"FAIL: a {self.role} rank (pid {self.process.pid}) hung for {BOUND} s")
        try:
            return self.conn.recv()
        except EOFError:
            return "died", None


def call_all(ranks: list[Rank], method: str, per_rank_kwargs: list[dict] | None = None) -> list:
    for i, r in enumerate(ranks):
        r.ask("call", method=method, kwargs=per_rank_kwargs[i] if per_rank_kwargs else {})
    answers = [r.answer() for r in ranks]
    for r, (status, result) in zip(ranks, answers):
        if status != "ok":
            raise SystemExit(f"FAIL: {method} on a {r.role} rank: {result}")
    return [result for _, result in answers]


def sync(engine_class, trainers: list[Rank], rollouts: list[Rank], step: int, kill: str | None = None,
         die_after: int = 0, trainers_late: float = 0) -> dict:
    """One weight sync, as verl's manager runs it; returns every rank's answer to send/receive.
    `kill`: trainer rank 1 dies "mid-send" (after `die_after` tensors) or "before-send".
    `trainers_late`: seconds the trainers start sending after the rollouts start receiving."""
    metadata = call_all(trainers + rollouts, "prepare")
    trainer_kwargs, rollout_kwargs = engine_class.build_topology(len(trainers), len(rollouts), metadata)
    per_trainer = [{k: v[i] for k, v in trainer_kwargs.items()} for i in range(len(trainers))]
    per_rollout = [{k: v[i] for k, v in rollout_kwargs.items()} for i in range(len(rollouts))]
    for i, r in enumerate(trainers):
        r.ask("call", method="init_process_group", kwargs=per_trainer[i])
    for i, r in enumerate(rollouts):
        r.ask("call", method="init_process_group", kwargs=per_rollout[i])
    for r in trainers + rollouts:
        status, result = r.answer()
        if status != "ok":
            raise SystemExit(f"FAIL: init_process_group on a {r.role} rank: {result}")
    if kill == "before-send":
        os.kill(trainers[1].process.pid, signal.SIGKILL)
        trainers[1].process.join()
    start = time.monotonic()
    for r in rollouts:
        r.ask("receive", step=step)
    time.sleep(trainers_late)
    senders = trainers if kill != "before-send" else trainers[:1]
    for i, r in enumerate(senders):
        r.ask("send", step=step, die_after=die_after if i == 1 and kill == "mid-send" else None)
    answers = {"send": [r.answer() for r in senders], "receive": [r.answer() for r in rollouts]}
    alive = [r for i, r in enumerate(trainers) if i != 1 or kill is None] + rollouts
    for r in alive:  # finalize too must answer (on a surviving trainer rank it raises)
        r.ask("call", method="finalize")
    answers["finalize"] = [r.answer() for r in alive]
    answers["seconds"] = time.monotonic() - start
    return answers


def check_failed_sync(step: int, kill: str, answers: dict) -> bool:
    """Every rollout rank's receive raised, and the surviving trainer rank's send or finalize (the
    failure may reach it before its offload completes); none hung."""
    receives = answers["receive"]
    survivor = [answers["send"][0], answers["finalize"][0]]  # trainer rank 0's two calls
    raised = [(s, m) for s, m in receives + survivor if s != "ok"]
    print(f"sync {step}: trainer rank 1 killed {kill}; {len(raised)} calls raised in "
          f"{answers['seconds']:.1f} s:", flush=True)
    for s, message in raised:
        print(f"  {s}: {message}")
    died = kill == "before-send" or answers["send"][1][0] == "died"
    return died and all(s != "ok" for s, _ in receives) and any(s != "ok" for s, _ in survivor)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu",
                        help="where the trainers' tensors live and the rollouts' land (cuda on a GPU host)")
    parser.add_argument("--replica-size", type=int, default=2, help="rollout ranks per replica")
    parser.add_argument("--megabytes", type=float, default=4.0, help="about this many MB of weights")
    parser.add_argument("--die-after", type=int, default=5,
                        help="sync 4: trainer rank 1 dies after this many tensors of its generator")
    parser.add_argument("--without-global-steps", action="store_true",
                        help="send_weights and receive_weights get no global_steps")
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(HERE, "verl_standin"))
    import ferry.verl
    from verl.checkpoint_engine.base import CheckpointEngineRegistry

    engine_class = CheckpointEngineRegistry.get("ferry")
    assert engine_class is ferry.verl.FerryCheckpointEngine
    ctx = multiprocessing.get_context("spawn")
    new = lambda role, master=False: Rank(ctx, role, master, args)
    trainers = [new("trainer", True), new("trainer")]
    rollouts = [new("rollout") for _ in range(REPLICAS * args.replica_size)]
    victim = args.replica_size  # replica 1's first rank
    kills = {4: "mid-send", 6: "before-send"}
    try:
        for step in range(1, 8):
            if step == 3:
                os.kill(rollouts[victim].process.pid, signal.SIGKILL)
                rollouts[victim].process.join()
                rollouts[victim] = new("rollout")
                print(f"sync 3: rollout rank {victim} (replica 1, rank 0) killed and replaced", flush=True)
            if step in (5, 7):
                trainers[1].process.join(BOUND)
                trainers[1] = new("trainer")
                print(f"sync {step}: trainer rank 1 replaced", flush=True)
            # Sync 3's trainers start late: the new rollout rank is caught up with version 2 first.
            answers = sync(engine_class, trainers, rollouts, step, kills.get(step), args.die_after,
                           trainers_late=1.0 if step == 3 else 0)
            if step in kills:
                if not check_failed_sync(step, kills[step], answers):
                    print("FAIL: every rollout rank's receive and the surviving trainer's finalize must raise")
                    return 1
                continue
            for s, result in answers["send"] + answers["receive"] + answers["finalize"]:
                if s != "ok":
                    print(f"FAIL: sync {step}: {result}")
                    return 1
            sends = [r for _, r in answers["send"]]
            receives = [r for _, r in answers["receive"]]
            print(f"sync {step}: {sum(x['bytes'] for x in sends) / 1e6:.1f} MB from {len(sends)} trainer ranks "
                  f"({', '.join(str(x['tensors']) for x in sends)} tensors) to {len(receives)} rollout ranks, "
                  f"every tensor equal; first tensor after {min(x['first_tensor_s'] for x in receives):.3f} s, "
                  f"all after {max(x['all_s'] for x in receives):.3f} s", flush=True)
        print("verl job: 7 syncs as expected")
        return 0
    finally:
        for r in trainers + rollouts:
            if r.process.is_alive():
                r.process.kill()


if __name__ == "__main__":
    sys.exit(main())
