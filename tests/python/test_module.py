"""The `ferry` Python module in one process: a coordinator, a trainer and rollouts on tcp, torch and
numpy tensors, the streaming receive, asyncio, and the errors a user meets."""
import asyncio
import glob
import os
import signal
import subprocess
import sys
import threading
import time

import numpy
import pytest
import torch

import ferry

SECRET = "python-test-secret-of-32-bytes!!"


def model(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {
        "embed": torch.randn(300, 64, generator=g),
        "layer.weight": torch.randn(128, 129, generator=g).to(torch.bfloat16),
        "layer.bias": torch.randn(129, generator=g).to(torch.float16),
        "steps": torch.arange(1000, dtype=torch.int64) * version,
    }


@pytest.fixture
def coordinator():
    c = ferry.Coordinator(trainers=1, instance_sizes=[2], chunk_bytes=32 * 1024, secret=SECRET)
    yield c
    c.close()


def test_versions_reach_a_registered_rollout_and_a_streaming_one_byte_for_byte(coordinator):
    weights = model(0)
    trainer = ferry.Trainer(coordinator=coordinator.address, secret=SECRET)
    for name, t in weights.items():
        trainer.register(name, torch.nn.Parameter(t, requires_grad=t.is_floating_point()) if name == "embed" else t)
    landing = {name: torch.zeros_like(t) for name, t in weights.items()}
    registered = ferry.Rollout(coordinator=coordinator.address, instance=0, rank=0, secret=SECRET,
                                listen_host="127.0.0.1")  # where the trainer reaches it
    for name, t in landing.items():
        registered.register(name, t)
    streaming = ferry.Rollout(coordinator=coordinator.address, instance=0, rank=1, secret=SECRET)
    trainer.join()
    registered.join()
    streaming.join()
    for version in (1, 2, 3):
        for name, t in model(version).items():
            weights[name].copy_(t)
        update = trainer.publish(version)
        assert update.version == version
        update.wait_offloaded(30)
        received = dict(streaming.receive(timeout=30))
        update.wait_delivered(30)
        registered.wait_version(version, timeout=30)
        assert streaming.version == version
        for name, t in model(version).items():
            assert torch.equal(landing[name], t), (version, name)
            assert received[name].dtype == t.dtype and torch.equal(received[name], t), (version, name)
        coordinator.wait_delivered(version, timeout=30)
    assert coordinator.delivered == 3
    for member in (trainer, registered, streaming):
        member.close()


def test_sharded_rollouts_receive_only_their_rows_and_tensors(coordinator):
    """Rank r holds rows [64 r, 64 r + 64) of `embed` (row-parallel), the whole of `layer.weight` or
    `layer.bias` (a subset), and `steps`; rows cut across 32 KiB chunks (a row is 256 bytes)."""
    weights = model(0)
    trainer = ferry.Trainer(coordinator=coordinator.address, secret=SECRET)
    for name, t in weights.items():
        trainer.register(name, t)
    rows = [(0, 150), (150, 150)]
    landing = [{"embed": torch.zeros(n, 64), "steps": torch.zeros(1000, dtype=torch.int64)} for _, n in rows]
    landing[0]["layer.weight"] = torch.zeros(128, 129, dtype=torch.bfloat16)
    landing[1]["layer.bias"] = torch.zeros(129, dtype=torch.float16)
    rollouts = []
    for rank, (first, _) in enumerate(rows):
        r = ferry.Rollout(coordinator=coordinator.address, instance=0, rank=rank, secret=SECRET)
        for name, t in landing[rank].items():
            if name == "embed":
                r.register_rows(name, t, first_row=first, shape=[300, 64])
            else:
                r.register(name, t)
        rollouts.append(r)
    with pytest.raises(ferry.InvalidArgument, match=r"rows \[290, 310\) lie outside its 300 rows"):
        ferry.Rollout(coordinator=coordinator.address, secret=SECRET).register_rows(
            "embed", torch.zeros(20, 64), first_row=290, shape=[300, 64])
    trainer.join()
    for r in rollouts:
        r.join()
    for version in (1, 2):
        for name, t in model(version).items():
            weights[name].copy_(t)
        trainer.publish(version).wait_delivered(30)
        for rank, r in enumerate(rollouts):
            r.wait_version(version, timeout=30)
            first, n = rows[rank]
            want = model(version)
            assert torch.equal(landing[rank]["embed"], want["embed"][first:first + n]), (version, rank)
            for name in landing[rank].keys() - {"embed"}:
                assert torch.equal(landing[rank][name], want[name]), (version, rank, name)
    for member in (trainer, *rollouts):
        member.close()


def test_numpy_arrays_and_raw_pointers_and_asyncio(coordinator):
    weight = numpy.arange(50_000, dtype=numpy.float32)
    raw = bytearray(range(256)) * 40
    raw_view = numpy.frombuffer(raw, dtype=numpy.uint8)
    trainer = ferry.Trainer(coordinator=coordinator.address, secret=SECRET)
    trainer.register("weight", weight)
    trainer.register_raw("raw", raw_view.ctypes.data, len(raw), owner=raw)
    got = numpy.zeros_like(weight)
    rollouts = [ferry.Rollout(coordinator=coordinator.address, instance=0, rank=r, secret=SECRET) for r in (0, 1)]
    rollouts[0].register("weight", got)
    got_raw = numpy.zeros(len(raw), dtype=numpy.uint8)
    rollouts[0].register_raw("raw", got_raw.ctypes.data, len(raw), owner=got_raw)
    trainer.join()
    for r in rollouts:
        r.join()

    async def one_version():
        update = trainer.publish(7)
        await update.offloaded(30)
        received = {name: t async for name, t in rollouts[1].areceive(7, timeout=30)}
        await update.delivered(30)
        return received

    received = asyncio.run(one_version())
    rollouts[0].wait_version(7, timeout=30)
    assert numpy.array_equal(got, weight) and bytes(got_raw) == bytes(raw)
    assert numpy.array_equal(received["weight"].numpy(), weight)
    assert bytes(received["raw"].numpy()) == bytes(raw)
    for member in (trainer, *rollouts):
        member.close()


def test_bad_input_raises_a_python_exception_naming_the_tensor(coordinator):
    with pytest.raises(ferry.InvalidArgument, match="'loud'"):
        ferry.set_log_level("loud")
    ferry.set_log_level("info")
    trainer = ferry.Trainer(coordinator=coordinator.address, secret=SECRET)
    with pytest.raises(ferry.InvalidArgument, match="'t'.*not contiguous"):
        trainer.register("t", torch.zeros(8, 8).t())
    with pytest.raises(ferry.InvalidArgument, match="'c'.*dtype"):
        trainer.register("c", torch.zeros(4, dtype=torch.complex64))
    with pytest.raises(ferry.InvalidArgument, match="'s'.*not a DLPack"):
        trainer.register("s", "a string")
    with pytest.raises(ferry.InvalidArgument, match="'r'.*shape"):
        trainer.register_raw("r", 1234, 16, dtype="f32")
    with pytest.raises(ferry.NotJoined):
        trainer.publish(1)
    with pytest.raises(ferry.InvalidArgument, match="no tensor"):
        trainer.join()
    trainer.register("ok", torch.zeros(4))
    with pytest.raises(ferry.InvalidArgument, match="registered twice"):
        trainer.register("ok", torch.zeros(4))
    assert isinstance(ferry.InvalidArgument("x"), ValueError)
    trainer.close()
    with pytest.raises(ferry.InvalidArgument, match="p2p 'nvlink': auto, device or host"):
        ferry.Coordinator(trainers=1, instance_sizes=[1], secret=SECRET, p2p="nvlink")

    streaming = ferry.Rollout(coordinator=coordinator.address, instance=0, rank=0, secret=SECRET)
    with pytest.raises(ferry.NotJoined):
        streaming.wait_version(1, timeout=0.1)
    landing = ferry.Rollout(coordinator=coordinator.address, instance=0, rank=1, secret=SECRET)
    landing.register("ok", torch.zeros(4))
    landing.join()
    with pytest.raises(ferry.InvalidArgument, match="registered its tensors"):
        next(landing.receive())
    with pytest.raises(ferry.AlreadyJoined):
        landing.register("late", torch.zeros(4))
    landing.close()


def test_waits_return_at_their_timeout_and_ctrl_c_interrupts_them(coordinator):
    rollout = ferry.Rollout(coordinator=coordinator.address, instance=0, rank=0, secret=SECRET)
    rollout.join()
    start = time.monotonic()
    with pytest.raises(ferry.TimedOut, match="version 5"):
        rollout.wait_version(5, timeout=0.3)
    assert 0.25 < time.monotonic() - start < 5
    with pytest.raises(TimeoutError):  # ferry.TimedOut is one
        next(rollout.receive(timeout=0.2))
    main = threading.get_ident()
    threading.Timer(0.3, lambda: signal.pthread_kill(main, signal.SIGINT)).start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        rollout.wait_version(5)  # no timeout: only the signal ends it
    assert time.monotonic() - start < 5
    rollout.close()
    with pytest.raises(ferry.Closed):
        rollout.wait_version(5, timeout=1)


def test_a_forked_child_refuses_to_use_ferry(coordinator):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: any use must raise, naming fork
        try:
            coordinator.wait_delivered(1, timeout=1)
            message = b"no error"
        except ferry.Error as e:
            message = str(e).encode()
        os.write(write, message)
        os._exit(0)
    os.close(write)
    message = os.read(read, 4096).decode()
    os.waitpid(pid, 0)
    assert "fork" in message, message


def test_a_streaming_rollout_with_views_yields_ferry_s_own_memory(coordinator):
    weights = model(0)
    trainer = ferry.Trainer(coordinator=coordinator.address, secret=SECRET)
    for name, t in weights.items():
        trainer.register(name, t)
    rollouts = [ferry.Rollout(coordinator=coordinator.address, instance=0, rank=r, secret=SECRET, views=True)
                for r in (0, 1)]
    trainer.join()
    for r in rollouts:
        r.join()
    first = None
    for version in (1, 2):
        for name, t in model(version).items():
            weights[name].copy_(t)
        trainer.publish(version).wait_offloaded(30)
        received = dict(rollouts[0].receive(version, timeout=30))
        rollouts[1].wait_version(version, timeout=30)
        for name, t in model(version).items():
            assert received[name].dtype == t.dtype and torch.equal(received[name], t), (version, name)
        first = first or received
        # A view, not a copy: version 1's tensors now hold version 2.
        assert all(torch.equal(first[name], received[name]) for name in received)
    for m in (trainer, *rollouts):
        m.close()


def test_a_written_publish_sends_what_write_was_given_in_any_order(coordinator):
    table = model(0)  # registered: names the table, never read
    trainer = ferry.Trainer(coordinator=coordinator.address, secret=SECRET)
    for name, t in table.items():
        trainer.register(name, t)
    rollouts = [ferry.Rollout(coordinator=coordinator.address, instance=0, rank=r, secret=SECRET) for r in (0, 1)]
    with pytest.raises(ferry.InvalidArgument, match="without publish_written"):
        trainer.write("embed", table["embed"])
    trainer.join()
    for r in rollouts:
        r.join()
    for version in (1, 2):
        update = trainer.publish(version, written=True)
        weights = model(version)
        with pytest.raises(ferry.InvalidArgument, match="'layer.bias' is 258 bytes, given 8000"):
            trainer.write("layer.bias", weights["steps"])
        names = list(weights)
        for name in reversed(names[1:]):
            trainer.write(name, weights[name].numpy() if name == "steps" else weights[name], timeout=30)
        with pytest.raises(ferry.InvalidArgument, match="written twice"):
            trainer.write("steps", weights["steps"])
        trainer.write(names[0], weights[names[0]], timeout=30)
        update.wait_offloaded(30)
        received = dict(rollouts[0].receive(version, timeout=30))
        rollouts[1].wait_version(version, timeout=30)
        for name, t in weights.items():
            assert received[name].dtype == t.dtype and torch.equal(received[name], t), (version, name)
    for m in (trainer, *rollouts):
        m.close()


def test_a_rollout_device_is_only_for_one_that_registers_nothing(coordinator):
    rollout = ferry.Rollout(coordinator=coordinator.address, secret=SECRET, device="cuda:0")
    rollout.register("embed", torch.zeros(300, 64))
    with pytest.raises(ferry.InvalidArgument, match="registers nothing"):
        rollout.join()
    with pytest.raises(ferry.InvalidArgument, match="a CUDA device"):
        ferry.Rollout(coordinator=coordinator.address, secret=SECRET, device="tpu:1")


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the GPU host)")


@needs_cuda
def test_cuda_tensors_are_copied_on_the_gpu_in_the_producer_s_stream_order():
    """A trainer's CUDA tensors reach a rollout's registered CUDA tensors and a streaming rollout
    on the GPU (each its own instance: NCCL takes one rank per GPU). The producer writes each
    version on a stream of its own, behind a spin of the GPU: publish must wait for it."""
    device = torch.device("cuda", 0)
    coordinator = ferry.Coordinator(trainers=1, instance_sizes=[1, 1], chunk_bytes=32 * 1024, secret=SECRET)
    weights = {name: t.to(device) for name, t in model(0).items()}
    trainer = ferry.Trainer(coordinator=coordinator.address, secret=SECRET)
    for name, t in weights.items():
        trainer.register(name, t)
    landing = {name: torch.zeros_like(t) for name, t in weights.items()}
    registered = ferry.Rollout(coordinator=coordinator.address, instance=0, secret=SECRET)
    for name, t in landing.items():
        registered.register(name, t)
    streaming = ferry.Rollout(coordinator=coordinator.address, instance=1, secret=SECRET, device=device)
    for m in (trainer, registered, streaming):
        m.join()
    for version in (1, 2, 3):
        producer = torch.cuda.Stream(device)
        with torch.cuda.stream(producer):
            torch.cuda._sleep(100_000_000)  # the copies below run well after publish is called
            for name, t in model(version).items():
                weights[name].copy_(t.to(device, non_blocking=True))
            update = trainer.publish(version)
        update.wait_offloaded(30)
        received = dict(streaming.receive(version, timeout=30))
        update.wait_delivered(30)
        registered.wait_version(version, timeout=30)
        consumer = torch.cuda.Stream(device)
        with torch.cuda.stream(consumer):  # another stream reads what wait_version said is there
            for name, t in model(version).items():
                assert torch.equal(landing[name].cpu(), t), (version, name)
                assert received[name].is_cuda and torch.equal(received[name].cpu(), t), (version, name)
    for m in (trainer, registered, streaming, coordinator):
        m.close()


@needs_cuda
def test_a_member_s_tensors_on_two_devices_are_refused_naming_both(coordinator):
    trainer = ferry.Trainer(coordinator=coordinator.address, secret=SECRET)
    trainer.register("embed", torch.zeros(300, 64, device="cuda:0"))
    trainer.register("layer.bias", torch.zeros(129))
    with pytest.raises(ferry.InvalidArgument, match="'embed' is in device 0 and tensor 'layer.bias' in host memory"):
        trainer.join()
    trainer.close()


def test_a_killed_member_s_shm_files_are_cleaned_up_before_it_is_reaped():
    """A rollout process on libfabric shm, SIGKILLed: its /dev/shm queue stays until the launcher
    cleans up after it, which a running process refuses."""
    coordinator = ferry.Coordinator(listen="fabric://shm", trainers=1, instance_sizes=[1], secret=SECRET)
    joins = (f"import time, ferry\n"
             f"r = ferry.Rollout(coordinator={coordinator.address!r}, secret={SECRET!r})\n"
             "r.join()\nprint('joined', flush=True)\ntime.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", joins], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))

    def files():
        return glob.glob(f"/dev/shm/{child.pid}:{os.getuid()}:*")

    try:
        assert child.stdout.readline().strip() == "joined"
        assert files(), "the rollout's shm endpoint made no file"
        with pytest.raises(ferry.InvalidArgument, match="still runs"):
            ferry.clean_up_killed_process(child.pid)
        child.send_signal(signal.SIGKILL)
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped
        assert files(), "SIGKILL left no file: nothing to clean up"
        count = len(files())
        assert ferry.clean_up_killed_process(child.pid) == count
        assert files() == []
    finally:
        child.kill()
        child.wait()
        coordinator.close()
