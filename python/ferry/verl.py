"""ferry as a verl checkpoint engine, named "ferry" (verl >= 0.9, verl/checkpoint_engine/base.py).

    actor_rollout_ref.rollout.checkpoint_engine.backend=ferry
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=ferry.verl
    actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.ferry.replica_size=<GPUs per replica>

Every sync verl calls `prepare` on every trainer and rollout rank, `build_topology` on its driver,
`init_process_group` everywhere, then each trainer rank's `send_weights` (each iterating the same
full generator) beside each rollout rank's `receive_weights`, then `finalize`. ferry's job outlives
the sync: the first `init_process_group` joins, later ones keep the job, its plan and its host
copies, and the job regroups by itself when a rank is replaced. The coordinator runs inside trainer
rank 0 (the engine built with `is_master=True`).

Each trainer rank copies the tensors it owns (the table split by bytes, the same way on every rank)
into tensors registered with ferry on the generator's device (a CUDA tensor stays on its GPU),
drains the rest of the generator, and publishes; `send_weights` returns once ferry has offloaded
them. `receive_weights` yields each tensor as soon as it is complete on this rank, in ferry's own
memory on engine_kwargs `device` (a GPU: ferry's copy engine fills it; default: host memory), with
no copy: a tensor yielded holds its bytes until the next sync's `receive_weights` starts.
`finalize` on a trainer rank waits until every rollout rank holds the version, so a version that
cannot be delivered raises there.

Each sync sends one version: `global_steps` when verl passes it (the same to every rank), else the
job's next version, which the master reads from its coordinator at `prepare` and `build_topology`
hands to every rank. So a rank that was replaced since the last sync (a new rollout process, a new
trainer rank) sends or receives the same version as the others, never the one before.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import secrets
import socket
import time
from typing import Any, AsyncGenerator, Generator

import torch

import ferry

try:
    from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
except ImportError:  # usable without verl (tests, other frameworks)
    CheckpointEngine, CheckpointEngineRegistry = object, None


# Each trainer rank publishes, under this name and its rank, a digest of the table it iterated.
TABLE_DIGEST = "ferry.verl.table_digest."


def _table_digest(table: list[tuple[str, torch.dtype, tuple[int, ...]]]) -> torch.Tensor:
    digest = hashlib.sha256(repr(table).encode()).digest()
    return torch.frombuffer(bytearray(digest), dtype=torch.uint8)


def _listen_host() -> str:
    """This node's address for the coordinator: Ray's view of it when Ray runs here."""
    if host := os.environ.get("FERRY_LISTEN_HOST"):
        return host
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address().strip("[]")
    except ImportError:
        pass
    return "127.0.0.1"


def _free_port(host: str) -> int:
    """A port free now for the coordinator to listen on at init_process_group. Taken below the
    kernel's ephemeral range, which outgoing connections draw from: none of them can take it in
    between (a port the kernel picked from that range could be)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    candidates = list(range(10000, max(10001, ephemeral_low)))
    random.shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
                return port
            except OSError:
                continue
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a crowded host: any free port
        s.bind((host, 0))
        return s.getsockname()[1]


# The engine_kwargs the engine takes, with their defaults.
ENGINE_KWARGS = {"replica_size": 1, "chunk_bytes": 64 << 20, "depth": 2, "timeout": 300.0, "device": None,
                 "secret": None}


class FerryCheckpointEngine(CheckpointEngine):
    """verl's checkpoint engine over ferry.

    Args:
        bucket_size: verl's update bucket in bytes; ferry's chunk is the smaller of it and
            `chunk_bytes`.
        is_master: trainer rank 0, which runs the coordinator.
    engine_kwargs (ENGINE_KWARGS):
        replica_size: rollout ranks per replica (the inference engine's world size).
        chunk_bytes, depth: ferry's chunk size and chunks in flight per stage.
        timeout: seconds any wait may take before it raises ferry.TimedOut.
        device: the CUDA device a rollout rank receives into ("cuda:N", an index; default: host
            memory).
        secret: the job secret; default: a fresh one from the master, handed out by build_topology.
    """

    def __init__(self, bucket_size: int, is_master: bool = False, **engine_kwargs: Any) -> None:
        unknown = set(engine_kwargs) - set(ENGINE_KWARGS)
        if unknown:
            raise ferry.InvalidArgument(f"ferry engine: unknown engine_kwargs {sorted(unknown)}; "
                                        f"it takes {sorted(ENGINE_KWARGS)}")
        options = {**ENGINE_KWARGS, **engine_kwargs}
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.replica_size = options["replica_size"]
        self.chunk_bytes = max(1 << 20, min(bucket_size, options["chunk_bytes"]))
        self.depth = options["depth"]
        self.timeout = options["timeout"]
        self.device = options["device"]
        self.secret = options["secret"] or os.environ.get("FERRY_SECRET") or None
        self.role: str | None = None
        self.coordinator: ferry.Coordinator | None = None
        self._listen: str | None = None
        self._shape: tuple[int, tuple[int, ...]] | None = None
        # Trainer rank:
        self.rank = 0
        self.world_size = 1
        self._coordinator_address = ""
        self._trainer: ferry.Trainer | None = None
        self._table: list[tuple[str, torch.dtype, tuple[int, ...]]] | None = None
        self._owners: list[int] = []
        self._staging: dict[str, torch.Tensor] = {}
        self._digest: torch.Tensor | None = None  # of the table, sent with the tensors
        self._version = 0
        self._sync_version: int | None = None  # this sync's version without global_steps
        self._pending: ferry.Update | None = None
        # Rollout rank:
        self._rollout: ferry.Rollout | None = None
        self._member: tuple[str, int, int] | None = None

    # --- every sync, every rank --------------------------------------------------------------

    def prepare(self) -> dict[str, Any]:
        """The master's coordinator address, job secret and the version this sync sends without
        `global_steps`; a rollout rank's replica size."""
        if self.is_master:
            if self._listen is None:
                host = _listen_host()
                self._listen = f"tcp://{host}:{_free_port(host)}"
                self.secret = self.secret or secrets.token_hex(16)
            if self.coordinator is None:
                address, version = self._listen, 1
            else:
                address, version = self.coordinator.address, self.coordinator.next_version
            return {"ferry_coordinator": address, "ferry_secret": self.secret, "ferry_version": version}
        return {"ferry_replica_size": self.replica_size}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int,
                       metadata: list[dict]) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """Trainer ranks come first in `metadata`, then the rollout ranks, replica by replica."""
        masters = [m for m in metadata[:actor_wg_world_size] if m and "ferry_coordinator" in m]
        if len(masters) != 1:
            raise ferry.InvalidArgument(f"ferry engine: {len(masters)} trainer ranks built with is_master=True; "
                                        "exactly one (rank 0) must be")
        sizes = {m.get("ferry_replica_size") for m in metadata[actor_wg_world_size:]}
        if len(sizes) != 1 or None in sizes:
            raise ferry.InvalidArgument(f"ferry engine: rollout ranks disagree on replica_size: {sorted(map(str, sizes))}")
        replica = sizes.pop()
        if rollout_world_size % replica:
            raise ferry.InvalidArgument(f"ferry engine: {rollout_world_size} rollout ranks are not whole replicas of "
                                        f"{replica}")
        job = {"coordinator": masters[0]["ferry_coordinator"], "secret": masters[0]["ferry_secret"],
               "version": masters[0]["ferry_version"]}
        trainers = actor_wg_world_size
        instance_sizes = [replica] * (rollout_world_size // replica)
        trainer_kwargs = {
            "role": ["trainer"] * trainers,
            "rank": list(range(trainers)),
            "world_size": [trainers] * trainers,
            "instance_sizes": [instance_sizes] * trainers,
            **{k: [v] * trainers for k, v in job.items()},
        }
        rollout_kwargs = {
            "role": ["rollout"] * rollout_world_size,
            "instance": [r // replica for r in range(rollout_world_size)],
            "rank": [r % replica for r in range(rollout_world_size)],
            **{k: [v] * rollout_world_size for k, v in job.items()},
        }
        return trainer_kwargs, rollout_kwargs

    def init_process_group(self, **kwargs: Any) -> None:
        """With this rank's share of build_topology's answer. The first call joins ferry's job (a
        trainer at its first send); later ones keep it."""
        try:
            role, rank, coordinator, secret = (kwargs[k] for k in ("role", "rank", "coordinator", "secret"))
        except KeyError as missing:
            raise ferry.InvalidArgument(f"init_process_group: no {missing}: pass this rank's share of what "
                                        "build_topology returned") from None
        world_size, instance_sizes, instance = kwargs.get("world_size", 1), kwargs.get("instance_sizes"), kwargs.get("instance", 0)
        self.role, self.secret = role, secret
        self._sync_version = kwargs.get("version")
        if role == "trainer":
            self.rank, self.world_size, self._coordinator_address = rank, world_size, coordinator
            if self.is_master:
                self._start_coordinator(world_size, instance_sizes or [1])
            return
        member = (coordinator, instance, rank)
        if self._rollout is not None and self._member == member:
            return
        if self._rollout is not None:
            self._rollout.close()
        self._rollout = ferry.Rollout(coordinator=coordinator, instance=instance, rank=rank, secret=secret,
                                      connect_timeout=self.timeout, device=self.device, views=True)
        self._rollout.join()
        self._member = member

    def finalize(self) -> None:
        """A trainer rank waits until every rollout rank holds the version it sent."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.wait_delivered(self.timeout)

    # --- trainer ranks ------------------------------------------------------------------------

    async def send_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None],
                           global_steps: int | None = None) -> dict[str, Any]:
        """Copies this rank's tensors out of `weights` (draining the rest) and publishes them as
        version `global_steps` (None: this sync's version, handed out by build_topology). After
        the first sync, tensors in host memory go straight into ferry's copy, each chunk leaving
        as soon as it is written: such a sync that fails midway (a tensor unlike the first sync's,
        the generator raising) fails its version for every rank, and this rank joins the job again
        at the next sync, whose version must be newer. A first sync, or one on GPUs, that fails
        publishes nothing."""
        if self.role != "trainer":
            raise ferry.NotJoined("send_weights: init_process_group did not make this a trainer rank")
        version = self._version_of_sync(global_steps)
        if version <= self._version:
            raise ferry.InvalidArgument(f"send_weights: version {version} is not newer than {self._version}")
        start = time.perf_counter()
        loop = asyncio.get_running_loop()
        if self._trainer is not None and all(not t.is_cuda for t in self._staging.values()):
            update = await loop.run_in_executor(None, lambda: self._trainer.publish(version, written=True))
            self._version = version  # even if the writes fail midway: the version is out
            # Off the event loop: ranks of this process (a colocated rollout) go on meanwhile.
            copied = await loop.run_in_executor(None, self._write_owned, weights)
        else:
            copied = self._copy_owned(weights)
            if self._trainer is None:
                await self._join_trainer()
            update = await loop.run_in_executor(None, self._trainer.publish, version)
        copy_done = time.perf_counter()
        self._version, self._pending = version, update
        await update.offloaded(self.timeout)
        end = time.perf_counter()
        return {"version": version, "tensors": len(self._staging), "bytes": copied,
                "copy_seconds": copy_done - start, "offload_seconds": end - copy_done, "total_seconds": end - start}

    async def _join_trainer(self) -> None:
        self._trainer = ferry.Trainer(coordinator=self._coordinator_address, shard=self.rank, secret=self.secret,
                                      connect_timeout=self.timeout)
        # What this rank saw of the whole table travels with its tensors (on their device, as a
        # member's tensors share one): rollout ranks compare.
        device = next(iter(self._staging.values())).device
        self._digest = _table_digest(self._table).to(device)
        self._trainer.register(f"{TABLE_DIGEST}{self.rank}", self._digest)
        for name, host in self._staging.items():
            self._trainer.register(name, host)
        await asyncio.get_running_loop().run_in_executor(None, self._trainer.join)

    def _version_of_sync(self, global_steps: int | None) -> int:
        if global_steps is not None:
            return global_steps
        if self._sync_version is None:
            raise ferry.InvalidArgument("no global_steps and no version from build_topology: run prepare, "
                                        "build_topology and init_process_group before each sync")
        return self._sync_version

    def _copy_owned(self, weights: Generator[tuple[str, torch.Tensor], None, None]) -> int:
        """Copies what this rank owns into its staging tensors (made by the first sync, on the
        generator's device), where ferry sends from."""
        copied = 0
        for name, tensor in self._owned(weights):
            if name not in self._staging:
                self._staging[name] = torch.empty_like(tensor, memory_format=torch.contiguous_format)
            self._staging[name].copy_(tensor, non_blocking=True)
            copied += tensor.numel() * tensor.element_size()
        if not self._staging:
            raise ferry.InvalidArgument(f"send_weights: trainer rank {self.rank} of {self.world_size} owns no "
                                        f"tensor ({len(self._table)} in the table)")
        return copied

    def _write_owned(self, weights: Generator[tuple[str, torch.Tensor], None, None]) -> int:
        """Writes what this rank owns straight into ferry's copy of the version published written.
        A rank that cannot finish it leaves the job (the version fails for every rank) and joins
        again at the next sync."""
        written = 0
        try:
            for name, tensor in self._owned(weights):
                self._trainer.write(name, tensor.contiguous(), self.timeout)
                written += tensor.numel() * tensor.element_size()
            self._trainer.write(f"{TABLE_DIGEST}{self.rank}", self._digest, self.timeout)
        except BaseException:
            self._trainer.close()
            self._trainer = None
            raise
        return written

    def _owned(self, weights: Generator[tuple[str, torch.Tensor], None, None]) -> Generator[
            tuple[str, torch.Tensor], None, None]:
        """Walks the whole generator, checking it against the first sync's table (which the first
        sync records, with each tensor's owner); yields the tensors this rank owns."""
        first = self._table is None
        table, load, count = [], [0] * self.world_size, 0
        for index, (name, tensor) in enumerate(weights):
            count = index + 1
            tensor = tensor.detach()
            meta = (name, tensor.dtype, tuple(tensor.shape))
            if first:
                table.append(meta)
                owner = min(range(self.world_size), key=lambda r: (load[r], r))  # the same on every rank
                load[owner] += tensor.numel() * tensor.element_size()
                self._owners.append(owner)
            elif index >= len(self._table) or self._table[index] != meta:
                had = self._table[index] if index < len(self._table) else "nothing"
                raise ferry.InvalidArgument(f"send_weights: tensor {index} '{name}' ({meta[1]}, {list(meta[2])}) on "
                                            f"trainer rank {self.rank} differs from the first sync's table ({had})")
            if self._owners[index] != self.rank:
                continue
            if not first and self._staging[name].device != tensor.device:
                raise ferry.InvalidArgument(f"send_weights: tensor '{name}' is on {tensor.device}, the first sync's "
                                            f"on {self._staging[name].device}")
            yield name, tensor
        if not first and count != len(self._table):
            raise ferry.InvalidArgument(f"send_weights: trainer rank {self.rank} got {count} tensors, the first "
                                        f"sync had {len(self._table)}")
        if first:
            self._table = table

    def _start_coordinator(self, trainers: int, instance_sizes: list[int]) -> None:
        shape = (trainers, tuple(instance_sizes))
        if self.coordinator is not None:
            if trainers != self._shape[0]:
                raise ferry.InvalidArgument(f"init_process_group: the job has {self._shape[0]} trainer ranks, now "
                                            f"{trainers}; ferry cannot change the trainer ranks of a running job")
            # Replicas added or removed (verl's add_replicas / remove_replicas): the running job takes
            # a new replica's ranks as a new instance, caught up at once, and drops one that left.
            self._shape = shape
            return
        self.coordinator = ferry.Coordinator(listen=self._listen, trainers=trainers, instance_sizes=instance_sizes,
                                             chunk_bytes=self.chunk_bytes, depth=self.depth, secret=self.secret)
        self._shape = shape

    # --- rollout ranks ------------------------------------------------------------------------

    async def receive_weights(self, global_steps: int | None = None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        """Each tensor of version `global_steps` as soon as it is here. None: this sync's version,
        handed out by build_topology (a rank that joined since the last sync skips the older
        version it was caught up with). A tensor yielded is ferry's own memory, on `device`: it
        holds this version until the next sync's `receive_weights` starts (copy what must
        outlive that)."""
        if self._rollout is None:
            raise ferry.NotJoined("receive_weights: init_process_group did not make this a rollout rank")
        digests: dict[int, torch.Tensor] = {}
        async for name, tensor in self._rollout.areceive(self._version_of_sync(global_steps), self.timeout):
            if name.startswith(TABLE_DIGEST):
                digests[int(name[len(TABLE_DIGEST):])] = tensor
                differ = [r for r, d in digests.items() if not torch.equal(d, next(iter(digests.values())))]
                if differ:
                    raise ferry.InvalidArgument(f"receive_weights: trainer ranks {sorted(digests)} did not iterate "
                                                f"the same tensor table (rank {differ[0]} differs from rank "
                                                f"{next(iter(digests))}): every rank must see the full generator")
                continue
            yield name, tensor

    def close(self) -> None:
        """Leaves ferry's job (the coordinator, on the master, stops it for everyone)."""
        for member in (self._trainer, self._rollout, self.coordinator):
            if member is not None:
                member.close()


if CheckpointEngineRegistry is not None:
    CheckpointEngineRegistry.register("ferry")(FerryCheckpointEngine)
