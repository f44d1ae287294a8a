#!/usr/bin/env python3
"""How many published bf16 weights change per AdamW step (issue 63, first measurement).

A small decoder-only transformer (plain torch, CPU) learns a synthetic token task: each sequence is
a walk on a fixed random Markov chain whose first half repeats as its second half, so the loss
falls through the embeddings (the chain), attention (the repeat) and the MLPs. It is first trained
--pretrain-steps at lr 1e-3 (the checkpoint an RL run would start from); then, from those same
weights and the same batches, one run per master precision and learning rate trains --steps more
with torch.optim.AdamW (betas 0.9/0.999, weight decay 0.01, constant lr, no clipping):

  fp32 master: the trainer holds fp32 weights and AdamW state and publishes their bf16 cast
               (what verl's FSDP and Megatron trainers hold and publish);
  bf16 master: the weights and AdamW's state are bf16 (torch's AdamW on bf16 tensors) and are
               published as they are.

After every step the published bf16 tensors are compared bit for bit (their int16 views) with the
previous step's, giving the fraction of elements that changed, per tensor kind, and per chunk of
the tensors laid end to end in parameter order (1, 4 and 64 MiB): changed elements, the bytes a
sparse encoding would need (int32 position + bf16 value, 6 bytes each) and the cheapest of
nothing / sparse / dense. The mechanism is checked beside it: Adam's intended step |u| (from its
state) against the spacing of bf16 at each weight (2^-7 of its power of two).

  /usr/bin/python3 bench/delta_fraction.py --out DIR [--steps 300] [--lrs 1e-6,3e-6,1e-5]
      [--masters fp32,bf16] [--seed 0] [--pretrain-steps 600] [--warmup 10]

Writes DIR/delta_fraction.json (every step's figures) and prints markdown tables; progress goes to
stderr. Ctrl-C stops the runs and reports what was measured. One thread: Debian's torch has no
BLAS (generic, ~3 GFLOP/s), so the matrix products go through oneDNN (~60 GFLOP/s on one core).
"""
import argparse
import json
import math
import os
import signal
import statistics
import sys
import time

import torch
import torch.nn.functional as F

VOCAB = 4096
WIDTH = 256
LAYERS = 4
HEADS = 4
SEQ = 128
BATCH = 4
SUCCESSORS = 8  # next tokens each token may have in the Markov chain
PRETRAIN_LR = 1e-3
WEIGHT_DECAY = 0.01
CHUNK_MIB = (1, 4, 64)
SPARSE_BYTES_PER_CHANGE = 6  # int32 position + bf16 value
BF16_BYTES = 2
KINDS = ("embeddings", "attention", "mlp", "norms")


def onednn_nt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b.T for 2-D fp32 tensors, through oneDNN's linear."""
    return torch._C._nn.mkldnn_linear(a.contiguous().to_mkldnn(), b.contiguous().to_mkldnn()).to_dense()


class MatmulNT(torch.autograd.Function):
    """a @ b.transpose(-1, -2) over a leading batch dimension, forward and backward on oneDNN."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.stack([onednn_nt(a[i], b[i]) for i in range(a.shape[0])])

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grad_a = torch.stack([onednn_nt(grad[i], b[i].t()) for i in range(a.shape[0])])
        grad_b = torch.stack([onednn_nt(grad[i].t(), a[i].t()) for i in range(a.shape[0])])
        return grad_a, grad_b


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(1, -1, x.shape[-1])
    return MatmulNT.apply(rows, weight.unsqueeze(0)).reshape(*x.shape[:-1], weight.shape[0])


def init_weight(rows: int, cols: int, std: float) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.randn(rows, cols) * std)


class RmsNorm(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(torch.nn.Module):
    """Pre-norm attention + GELU MLP, no biases (Llama's layout, learned positions instead of RoPE)."""

    def __init__(self):
        super().__init__()
        out_std = 0.02 / math.sqrt(2 * LAYERS)
        self.attn_norm = RmsNorm(WIDTH)
        self.attn_qkv = init_weight(3 * WIDTH, WIDTH, 0.02)
        self.attn_out = init_weight(WIDTH, WIDTH, out_std)
        self.mlp_norm = RmsNorm(WIDTH)
        self.mlp_up = init_weight(4 * WIDTH, WIDTH, 0.02)
        self.mlp_down = init_weight(WIDTH, 4 * WIDTH, out_std)

    def attention(self, x):
        batch, seq, _ = x.shape
        head_dim = WIDTH // HEADS
        qkv = linear(self.attn_norm(x), self.attn_qkv).reshape(batch, seq, 3, HEADS, head_dim)
        q, k, v = (qkv[:, :, i].transpose(1, 2).reshape(batch * HEADS, seq, head_dim) for i in range(3))
        scores = MatmulNT.apply(q, k) / math.sqrt(head_dim)
        causal = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        probs = scores.masked_fill(causal, float("-inf")).softmax(-1)
        mixed = MatmulNT.apply(probs, v.transpose(1, 2))
        return linear(mixed.reshape(batch, HEADS, seq, head_dim).transpose(1, 2).reshape(batch, seq, WIDTH),
                      self.attn_out)

    def forward(self, x):
        x = x + self.attention(x)
        return x + linear(F.gelu(linear(self.mlp_norm(x), self.mlp_up)), self.mlp_down)


class DecoderLm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = init_weight(VOCAB, WIDTH, 0.02)
        self.embed_positions = init_weight(SEQ, WIDTH, 0.02)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.final_norm = RmsNorm(WIDTH)
        self.head = init_weight(VOCAB, WIDTH, 0.02)  # untied, as in Llama-8B

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens[tokens[:, :-1]] + self.embed_positions
        for block in self.blocks:
            x = block(x)
        logits = linear(self.final_norm(x), self.head)
        return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def kind_of(name: str) -> str:
    if "norm" in name:
        return "norms"
    if "embed" in name or "head" in name:
        return "embeddings"  # the output head counts with the embeddings: both are vocab x width
    return "attention" if "attn" in name else "mlp"


class MarkovRepeatTask:
    """Sequences whose first half walks a fixed random Markov chain and whose second half repeats it."""

    def __init__(self, seed: int):
        chain = torch.Generator().manual_seed(seed)
        self.successors = torch.randint(VOCAB, (VOCAB, SUCCESSORS), generator=chain)
        self.successor_probs = (torch.randn(VOCAB, SUCCESSORS, generator=chain) * 1.5).softmax(-1)

    def batch(self, sampler: torch.Generator) -> torch.Tensor:
        walk_len = (SEQ + 2) // 2
        token = torch.randint(VOCAB, (BATCH,), generator=sampler)
        walk = [token]
        for _ in range(walk_len - 1):
            pick = torch.multinomial(self.successor_probs[token], 1, generator=sampler).squeeze(1)
            token = self.successors[token, pick]
            walk.append(token)
        walk = torch.stack(walk, 1)
        return torch.cat([walk, walk], 1)[:, :SEQ + 1]


class Trainer:
    """One run: the model, its master weights (fp32 or bf16) and AdamW; publishes bf16 tensors."""

    def __init__(self, start_state: dict, master: str, lr: float):
        self.model = DecoderLm()
        self.model.load_state_dict(start_state)
        self.params = list(self.model.parameters())
        self.bf16_master = master == "bf16"
        self.masters = self.params
        if self.bf16_master:
            # The model computes in fp32 from the bf16 masters' exact values; AdamW updates the bf16 tensors.
            self.masters = [p.detach().to(torch.bfloat16).requires_grad_() for p in self.params]
            self.copy_masters_into_model()
        self.optimizer = torch.optim.AdamW(self.masters, lr=lr, weight_decay=WEIGHT_DECAY)

    def copy_masters_into_model(self):
        with torch.no_grad():
            for param, master in zip(self.params, self.masters):
                param.copy_(master)

    def step(self, tokens: torch.Tensor) -> float:
        loss = self.model.loss(tokens)
        loss.backward()
        if self.bf16_master:
            for param, master in zip(self.params, self.masters):
                master.grad, param.grad = param.grad.to(torch.bfloat16), None
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.bf16_master:
            self.copy_masters_into_model()
        return loss.item()

    def published_bits(self) -> torch.Tensor:
        """Every published bf16 tensor end to end, as int16 so comparisons are of bits."""
        return torch.cat([m.detach().to(torch.bfloat16).reshape(-1) for m in self.masters]).view(torch.int16)

    def intended_update(self) -> torch.Tensor:
        """|Adam's last step| per element before rounding, from its state (weight decay left out: lr * 0.01 * |w|
        is ~1e-3 of it here)."""
        group = self.optimizer.param_groups[0]
        beta1, beta2 = group["betas"]
        steps = []
        for master in self.masters:
            state = self.optimizer.state[master]
            count = float(state["step"])
            first = state["exp_avg"].float() / (1 - beta1 ** count)
            second = state["exp_avg_sq"].float() / (1 - beta2 ** count)
            steps.append((group["lr"] * first / (second.sqrt() + group["eps"])).abs().reshape(-1))
        return torch.cat(steps)


def bf16_spacing(bits: torch.Tensor) -> torch.Tensor:
    """The gap between a bf16 value and the next one up: its power of two (the exponent bits alone) times 2^-7."""
    power_of_two = (bits & 0x7F80).view(torch.bfloat16).float()
    return power_of_two.clamp(min=2.0**-126) * 2.0**-7


class DeltaMeter:
    """Compares two published versions: changed elements in all, per tensor kind and per chunk."""

    def __init__(self, model: DecoderLm):
        self.layout = [(name, kind_of(name), p.numel()) for name, p in model.named_parameters()]
        self.elements = sum(count for _, _, count in self.layout)
        self.kind_segments = []
        start = 0
        for _, kind, count in self.layout:
            self.kind_segments.append((kind, start, start + count))
            start += count
        self.chunk_elements = {mib: self.chunk_sizes(mib) for mib in CHUNK_MIB}

    def chunk_sizes(self, mib: int) -> list:
        full = mib * 2**20 // BF16_BYTES
        chunks = -(-self.elements // full)
        return [full] * (chunks - 1) + [self.elements - full * (chunks - 1)]

    def kind_elements(self) -> dict:
        return {kind: sum(count for _, k, count in self.layout if k == kind) for kind in KINDS}

    def measure(self, before: torch.Tensor, after: torch.Tensor, update: torch.Tensor) -> dict:
        changed = (before != after).view(torch.uint8)  # uint8 sums run 4x faster than bool ones here
        per_kind = dict.fromkeys(KINDS, 0)
        for kind, start, end in self.kind_segments:
            per_kind[kind] += int(changed[start:end].sum(dtype=torch.int64))
        per_mib = self.changed_per_mib(changed)
        per_chunk = {str(mib): [sum(per_mib[i:i + mib]) for i in range(0, len(per_mib), mib)] for mib in CHUNK_MIB}
        update_in_ulps = update / bf16_spacing(before)
        return {"changed": sum(per_kind.values()), "per_kind": per_kind, "per_chunk": per_chunk,
                "update_over_half_ulp": float((update_in_ulps > 0.5).float().mean()),
                "expected_crossings": float(update_in_ulps.clamp(max=1).mean())}

    def changed_per_mib(self, changed: torch.Tensor) -> list:
        """Changed elements per MiB of the stream; every chunk size is a whole number of MiB."""
        per_mib = 2**20 // BF16_BYTES
        whole = self.elements // per_mib
        counts = changed[:whole * per_mib].reshape(whole, per_mib).sum(1, dtype=torch.int64).tolist()
        if self.elements > whole * per_mib:
            counts.append(int(changed[whole * per_mib:].sum(dtype=torch.int64)))
        return counts


def pretrain(model: DecoderLm, task: MarkovRepeatTask, args) -> dict:
    """Trains from random weights at PRETRAIN_LR: the checkpoint every measured run starts from."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=PRETRAIN_LR, weight_decay=WEIGHT_DECAY)
    sampler = torch.Generator().manual_seed(args.seed + 2)
    for step in range(1, args.pretrain_steps + 1):
        loss = model.loss(task.batch(sampler))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step == 1 or step % 20 == 0:
            print(f"pretrain step {step} loss {loss.item():.3f}", file=sys.stderr, flush=True)
    return {name: t.clone() for name, t in model.state_dict().items()}


def train_run(run: dict, start_state: dict, task: MarkovRepeatTask, meter: DeltaMeter, args):
    """Appends one record per step to run["steps"], so an interrupted run keeps what it measured."""
    trainer = Trainer(start_state, run["master"], run["lr"])
    sampler = torch.Generator().manual_seed(args.seed + 1)  # every run sees the same batches
    before = trainer.published_bits()
    for step in range(1, args.steps + 1):
        began = time.perf_counter()
        loss = trainer.step(task.batch(sampler))
        after = trainer.published_bits()
        record = meter.measure(before, after, trainer.intended_update())
        record.update(step=step, loss=loss, seconds=time.perf_counter() - began)
        run["steps"].append(record)
        before = after
        if step == 1 or step % 10 == 0:
            print(f"{run['master']} lr {run['lr']:g} step {step} loss {loss:.4f} "
                  f"changed {record['changed'] / meter.elements:.4%} ({record['seconds']:.2f} s)",
                  file=sys.stderr, flush=True)


def spread(values: list) -> dict:
    if len(values) < 2:
        return {"median": values[0], "p10": values[0], "p90": values[0]}
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return {"median": statistics.median(values), "p10": deciles[0], "p90": deciles[8]}


def cheapest_encoding(changed: int, elements: int) -> tuple:
    """(encoding, bytes) of a chunk: nothing if unchanged, else the smaller of sparse and dense."""
    if changed == 0:
        return "unchanged", 0
    sparse, dense = SPARSE_BYTES_PER_CHANGE * changed, BF16_BYTES * elements
    return ("sparse", sparse) if sparse < dense else ("dense", dense)


def summarize_chunks(steps: list, meter: DeltaMeter, mib: int) -> dict:
    sizes = meter.chunk_elements[mib]
    shares = dict.fromkeys(("unchanged", "sparse", "dense"), 0)
    sent_over_dense = []
    for record in steps:
        sent = 0
        for changed, elements in zip(record["per_chunk"][str(mib)], sizes):
            encoding, size = cheapest_encoding(changed, elements)
            shares[encoding] += 1
            sent += size
        sent_over_dense.append(sent / (BF16_BYTES * meter.elements))
    chunk_count = len(steps) * len(sizes)
    return {"chunks": len(sizes), "sent_over_dense": spread(sent_over_dense),
            "shares": {encoding: count / chunk_count for encoding, count in shares.items()}}


def summarize_run(run: dict, meter: DeltaMeter, warmup: int):
    steps = run["steps"][warmup:]
    if not steps:
        return None
    fractions = [record["changed"] / meter.elements for record in steps]
    kind_elements = meter.kind_elements()
    losses = [record["loss"] for record in run["steps"]]
    return {
        "steps_measured": len(steps),
        "loss_first_10": statistics.mean(losses[:10]), "loss_last_10": statistics.mean(losses[-10:]),
        "changed_fraction": spread(fractions),
        "sparse_over_dense": spread([f * SPARSE_BYTES_PER_CHANGE / BF16_BYTES for f in fractions]),
        "per_kind": {kind: spread([r["per_kind"][kind] / kind_elements[kind] for r in steps]) for kind in KINDS},
        "update_over_half_ulp": spread([record["update_over_half_ulp"] for record in steps]),
        "expected_crossings": spread([record["expected_crossings"] for record in steps]),
        "chunks": {str(mib): summarize_chunks(steps, meter, mib) for mib in CHUNK_MIB},
    }


def percent(x: float) -> str:
    return f"{100 * x:.3g}%"


def spread_text(s: dict, fmt=percent) -> str:
    return f"{fmt(s['median'])} [{fmt(s['p10'])}, {fmt(s['p90'])}]"


def print_tables(runs: list, warmup: int):
    done = [run for run in runs if run.get("summary")]
    print(f"\nPer step after {warmup} warm-up steps: median [p10, p90].\n")
    # Pipes inside a cell are escaped, or markdown reads |u| as three columns.
    print(r"| master | lr | steps | loss, first 10 -> last 10 | changed | sparse / dense | \|u\| > ulp/2 "
          r"| E[min(1, \|u\|/ulp)] |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for run in done:
        s = run["summary"]
        print(f"| {run['master']} | {run['lr']:g} | {s['steps_measured']} | {s['loss_first_10']:.3f} -> "
              f"{s['loss_last_10']:.3f} | {spread_text(s['changed_fraction'])} | {spread_text(s['sparse_over_dense'])} "
              f"| {spread_text(s['update_over_half_ulp'])} | {spread_text(s['expected_crossings'])} |")
    print("\n| master | lr | " + " | ".join(KINDS) + " |")
    print("| --- | --- |" + " --- |" * len(KINDS))
    for run in done:
        cells = " | ".join(percent(run["summary"]["per_kind"][kind]["median"]) for kind in KINDS)
        print(f"| {run['master']} | {run['lr']:g} | {cells} |")
    print("\n| master | lr | chunk | chunks | sent / dense (cheapest per chunk) | unchanged | sparse | dense |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for run in done:
        for mib, c in run["summary"]["chunks"].items():
            shares = " | ".join(percent(c["shares"][e]) for e in ("unchanged", "sparse", "dense"))
            print(f"| {run['master']} | {run['lr']:g} | {mib} MiB | {c['chunks']} | "
                  f"{spread_text(c['sent_over_dense'])} | {shares} |")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for delta_fraction.json")
    parser.add_argument("--steps", type=int, default=300, help="measured steps per run")
    parser.add_argument("--lrs", default="1e-6,3e-6,1e-5", help="comma-separated learning rates")
    parser.add_argument("--masters", default="fp32,bf16", help="fp32 (publish the bf16 cast) and/or bf16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pretrain-steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=10, help="first steps of each run left out of the spreads")
    args = parser.parse_args()
    args.lrs = [float(lr) for lr in args.lrs.split(",")]
    args.masters = args.masters.split(",")
    return args


def config(args, meter: DeltaMeter) -> dict:
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "seed": args.seed,
            "model": {"vocab": VOCAB, "width": WIDTH, "layers": LAYERS, "heads": HEADS, "seq": SEQ,
                      "parameters": meter.elements, "kind_elements": meter.kind_elements()},
            "task": f"Markov chain ({SUCCESSORS} successors per token), first half repeated",
            "batch": BATCH, "pretrain_steps": args.pretrain_steps, "pretrain_lr": PRETRAIN_LR,
            "weight_decay": WEIGHT_DECAY, "steps": args.steps, "warmup": args.warmup,
            "chunk_mib": list(CHUNK_MIB), "layout": meter.layout}


def main():
    args = parse_args()
    torch.set_num_threads(1)  # the other core runs another benchmark
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C reports, even when started in the background
    torch.manual_seed(args.seed)
    began = time.perf_counter()
    task = MarkovRepeatTask(args.seed)
    model = DecoderLm()
    meter = DeltaMeter(model)
    report = {"config": config(args, meter), "runs": []}
    print(f"{meter.elements} parameters, {BF16_BYTES * meter.elements / 2**20:.1f} MiB in bf16", file=sys.stderr)
    try:
        start_state = pretrain(model, task, args)
        for master in args.masters:
            for lr in args.lrs:
                run = {"master": master, "lr": lr, "steps": []}
                report["runs"].append(run)
                train_run(run, start_state, task, meter, args)
    except KeyboardInterrupt:
        report["interrupted"] = True
        print("interrupted: reporting what was measured", file=sys.stderr)
    report["seconds"] = time.perf_counter() - began
    for run in report["runs"]:
        run["summary"] = summarize_run(run, meter, args.warmup)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "delta_fraction.json"), "w") as out:
        json.dump(report, out)
    print_tables(report["runs"], args.warmup)
    print(f"\n{report['seconds']:.0f} s in all", file=sys.stderr)


if __name__ == "__main__":
    main()
