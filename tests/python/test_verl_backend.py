"""ferry's verl backend in one process (one trainer rank, one replica of one rank): verl's call
order, then the bad input a verl user can give it. tests/python/verl_job.py runs the real
multi-process job."""
import asyncio
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "verl_standin"))
import ferry  # noqa: E402
import ferry.verl  # noqa: E402
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry  # noqa: E402


def weights(step: int, rename: str | None = None, fail_at: int | None = None):
    for i in range(6):
        if i == fail_at:
            raise RuntimeError(f"the trainer's generator failed at tensor {i}")
        name = f"layer{i}.weight" if i != 3 or rename is None else rename
        yield name, torch.full((100, 10 + i), float(step * 10 + i), dtype=torch.bfloat16 if i % 2 else torch.float32)


def expected(step: int) -> dict[str, torch.Tensor]:
    return dict(weights(step))


@pytest.fixture
def job():
    """A trainer and a rollout engine, set up as verl's manager does every sync."""
    trainer = CheckpointEngineRegistry.new("ferry", bucket_size=1 << 20, is_master=True, timeout=5.0)
    rollout = CheckpointEngineRegistry.new("ferry", bucket_size=1 << 20, replica_size=1, timeout=5.0)

    def init():
        metadata = [trainer.prepare(), rollout.prepare()]
        trainer_kwargs, rollout_kwargs = type(trainer).build_topology(1, 1, metadata)
        trainer.init_process_group(**{k: v[0] for k, v in trainer_kwargs.items()})
        rollout.init_process_group(**{k: v[0] for k, v in rollout_kwargs.items()})

    yield trainer, rollout, init
    rollout.close()
    trainer.close()


async def receive_all(rollout, step):
    return {name: t async for name, t in rollout.receive_weights(global_steps=step)}


def sync(trainer, rollout, init, step):
    init()

    async def both():
        return await asyncio.gather(trainer.send_weights(weights(step), global_steps=step),
                                    receive_all(rollout, step))

    metrics, got = asyncio.run(both())
    trainer.finalize()
    rollout.finalize()
    return metrics, got


def test_replicas_added_and_removed_between_syncs(job):
    """verl's add_replicas / remove_replicas: the running job takes a new replica, caught up with the
    version before it, and goes on without one that left."""
    trainer, rollout, init = job
    sync(trainer, rollout, init, 1)
    added = CheckpointEngineRegistry.new("ferry", bucket_size=1 << 20, replica_size=1, timeout=5.0)
    try:
        metadata = [trainer.prepare(), rollout.prepare(), added.prepare()]
        trainer_kwargs, rollout_kwargs = type(trainer).build_topology(1, 2, metadata)
        trainer.init_process_group(**{k: v[0] for k, v in trainer_kwargs.items()})
        rollout.init_process_group(**{k: v[0] for k, v in rollout_kwargs.items()})
        added.init_process_group(**{k: v[1] for k, v in rollout_kwargs.items()})

        async def to_both():
            return await asyncio.gather(trainer.send_weights(weights(2), global_steps=2), receive_all(rollout, 2),
                                        receive_all(added, 2))

        _, got, got_added = asyncio.run(to_both())
        trainer.finalize()
        for received in (got, got_added):
            assert received.keys() == expected(2).keys()
            assert all(torch.equal(received[n], t) for n, t in expected(2).items())
    finally:
        added.close()  # the replica is removed
    metrics, got = sync(trainer, rollout, init, 3)
    assert metrics["version"] == 3
    assert all(torch.equal(got[n], t) for n, t in expected(3).items())


def test_registered_as_ferry_with_verls_interface():
    engine = CheckpointEngineRegistry.get("ferry")
    assert engine is ferry.verl.FerryCheckpointEngine and issubclass(engine, CheckpointEngine)
    with pytest.raises(ferry.InvalidArgument, match="unknown engine_kwargs"):
        CheckpointEngineRegistry.new("ferry", bucket_size=1, no_such_option=1)


def test_syncs_deliver_every_tensor_and_the_job_survives_bad_syncs(job):
    trainer, rollout, init = job
    metrics, got = sync(trainer, rollout, init, 1)
    assert metrics["version"] == 1 and metrics["tensors"] == 6 and metrics["bytes"] > 0
    assert got.keys() == expected(1).keys()
    assert all(torch.equal(got[n], t) for n, t in expected(1).items())

    # After the first sync the trainer writes straight into ferry's copy while chunks leave: a
    # table that differs from the first sync's is refused by name and its version fails; so does
    # a generator that raises midway; the trainer rank joins again at the next sync.
    init()
    with pytest.raises(ferry.InvalidArgument, match="'renamed'.*differs from the first sync"):
        asyncio.run(trainer.send_weights(weights(2, rename="renamed"), global_steps=2))
    with pytest.raises(ferry.InvalidArgument, match="version 2 is not newer than 2"):
        asyncio.run(trainer.send_weights(weights(2), global_steps=2))
    with pytest.raises(RuntimeError, match="failed at tensor 4"):
        asyncio.run(trainer.send_weights(weights(3, fail_at=4), global_steps=3))

    metrics, got = sync(trainer, rollout, init, 4)
    assert all(torch.equal(got[n], t) for n, t in expected(4).items())

    # A rollout asking for a version that is never published: told so, by version.
    init()

    async def skipped():
        receiving = asyncio.ensure_future(receive_all(rollout, 5))
        await trainer.send_weights(weights(6), global_steps=6)
        return await receiving

    with pytest.raises(ferry.InvalidArgument, match="version 5 was never published"):
        asyncio.run(skipped())
    trainer.finalize()


def test_topology_errors_name_the_problem():
    engine = ferry.verl.FerryCheckpointEngine
    master = {"ferry_coordinator": "tcp://127.0.0.1:1", "ferry_secret": "x" * 32, "ferry_version": 7}
    with pytest.raises(ferry.InvalidArgument, match="2 trainer ranks built with is_master"):
        engine.build_topology(2, 2, [master, master, {"ferry_replica_size": 2}, {"ferry_replica_size": 2}])
    with pytest.raises(ferry.InvalidArgument, match="not whole replicas"):
        engine.build_topology(1, 3, [master] + [{"ferry_replica_size": 2}] * 3)
    trainer_kwargs, rollout_kwargs = engine.build_topology(1, 4, [master] + [{"ferry_replica_size": 2}] * 4)
    assert trainer_kwargs["instance_sizes"] == [[2, 2]]
    assert rollout_kwargs["instance"] == [0, 0, 1, 1] and rollout_kwargs["rank"] == [0, 1, 0, 1]
    assert trainer_kwargs["version"] == [7] and rollout_kwargs["version"] == [7] * 4  # the sync's version


def test_trainer_ranks_that_iterate_different_tables_are_named():
    engine = ferry.verl.FerryCheckpointEngine
    ranks = [engine(1 << 20, is_master=True, timeout=5.0), engine(1 << 20, timeout=5.0)]
    rollout = engine(1 << 20, timeout=5.0)
    trainer_kwargs, rollout_kwargs = engine.build_topology(2, 1, [e.prepare() for e in (*ranks, rollout)])
    for i, e in enumerate(ranks):
        e.init_process_group(**{k: v[i] for k, v in trainer_kwargs.items()})
    rollout.init_process_group(**{k: v[0] for k, v in rollout_kwargs.items()})

    async def both():
        # Rank 1's table names one tensor differently, one that rank 0 owns: only the digests tell.
        return await asyncio.gather(ranks[0].send_weights(weights(1), 1),
                                    ranks[1].send_weights(weights(1, rename="renamed"), 1), receive_all(rollout, 1),
                                    return_exceptions=True)

    sent0, sent1, received = asyncio.run(both())
    assert isinstance(sent0, dict) and isinstance(sent1, dict)
    assert isinstance(received, ferry.InvalidArgument) and "did not iterate the same tensor table" in str(received)
    for e in (rollout, *ranks):
        e.close()
