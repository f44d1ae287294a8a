"""ferry: publish a trainer's tensors to every rollout worker, version after version.

    coordinator = ferry.Coordinator(trainers=1, instance_sizes=[2], secret=SECRET)

    trainer = ferry.Trainer(coordinator=coordinator.address, secret=SECRET)
    trainer.register("layer.weight", weight)   # torch tensor, numpy array, anything with __dlpack__
    trainer.join()
    update = trainer.publish(1)
    update.wait_offloaded()                     # the step may write `weight` again from here
    update.wait_delivered()

    rollout = ferry.Rollout(coordinator=address, instance=0, rank=1, secret=SECRET)
    rollout.join()                              # nothing registered: receive the trainers' table
    for name, tensor in rollout.receive():      # each tensor of the next version, as it completes
        ...

A rollout may instead register where each tensor lands and call `wait_version(v)`. Waits take a
timeout in seconds (None: no limit), release the GIL, and let Ctrl-C through; `await
update.offloaded()`, `await update.delivered()` and `async for ... in rollout.areceive()` serve
asyncio programs. Errors are `ferry.Error` subclasses carrying ferry's message.

CUDA tensors (torch, or anything with `__dlpack__` on a CUDA device) are registered as they are:
ferry copies them on that GPU's streams, and GPU to GPU where the other end is a GPU of this host.
`publish` first waits for the work queued on each such GPU's current torch stream (other
producers synchronise their own streams before publishing); a rollout's CUDA tensors hold the
version once `wait_version` returns. One member's tensors all live on one device.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Iterator

from ._ferry import (  # noqa: F401  (re-exported)
    AlreadyJoined,
    Busy,
    Closed,
    Coordinator,
    Error,
    InvalidArgument,
    JobFailed,
    NotJoined,
    TimedOut,
    Unreachable,
    UpdateFailed,
    __version__,
    clean_up_killed_process,
    set_log_level,
)
from . import _ferry

try:
    import torch
except ImportError:  # numpy and raw pointers still work
    torch = None
import numpy

__all__ = ["Coordinator", "Trainer", "Rollout", "Update", "set_log_level", "clean_up_killed_process", "Error", "InvalidArgument", "Closed", "NotJoined",
           "AlreadyJoined", "Busy", "TimedOut", "Unreachable", "JobFailed", "UpdateFailed", "torch_dtype"]

_TORCH_DTYPES = {
    "u8": "uint8", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "f16": "float16",
    "bf16": "bfloat16", "f32": "float32", "f64": "float64", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
}
_NUMPY_DTYPES = {"u8": "uint8", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "f16": "float16",
                 "f32": "float32", "f64": "float64"}


def torch_dtype(dtype: str):
    """The torch dtype of one of ferry's dtype names."""
    found = getattr(torch, _TORCH_DTYPES.get(dtype, ""), None) if torch else None
    if found is None:
        raise InvalidArgument(f"dtype '{dtype}' has no torch equivalent here")
    return found


def _as_array(dtype: str, shape: list[int], raw: Any) -> Any:
    """Received bytes (a numpy array, or a DLPack capsule of CUDA memory) as a torch tensor
    (numpy array without torch), without copying."""
    if torch is not None:
        data = torch.from_numpy(raw) if isinstance(raw, numpy.ndarray) else torch.utils.dlpack.from_dlpack(raw)
        return data.view(torch_dtype(dtype)).reshape(shape)
    if not isinstance(raw, numpy.ndarray):
        raise InvalidArgument("tensors on a CUDA device need torch")
    if dtype not in _NUMPY_DTYPES:
        raise InvalidArgument(f"dtype '{dtype}' needs torch")
    return raw.view(_NUMPY_DTYPES[dtype]).reshape(shape)


def _is_torch(t: Any) -> bool:
    return torch is not None and isinstance(t, torch.Tensor)


def _readable(name: str, tensor: Any) -> Any:
    """What ferry can read: torch tensors detached (nn.Parameter included) and bools as bytes."""
    if not _is_torch(tensor):
        return tensor
    tensor = tensor.detach()
    if not tensor.is_contiguous():
        raise InvalidArgument(f"tensor '{name}': not contiguous (strides {tuple(tensor.stride())}); "
                              "pass .contiguous() or a copy")
    return tensor.view(torch.uint8) if tensor.dtype == torch.bool else tensor


def _device_index(device: Any) -> int:
    """A CUDA device's index from an int, "cuda[:N]" or a torch.device; -1 for None or "cpu"."""
    if device is None:
        return -1
    if isinstance(device, int):
        return device
    kind, _, index = str(device).partition(":")
    if kind == "cpu" and not index:
        return -1
    if kind != "cuda" or not (index.isdigit() or not index):
        raise InvalidArgument(f"device {device!r}: a CUDA device (an index, 'cuda:N') or 'cpu'")
    if index:
        return int(index)
    return torch.cuda.current_device() if torch is not None else 0


class Update:
    """One published version: wait for (or await) its offload and its delivery."""

    def __init__(self, native: _ferry.Update):
        self._native = native

    @property
    def version(self) -> int:
        return self._native.version

    def wait_offloaded(self, timeout: float | None = None) -> None:
        """Until the tensors are copied out: the trainer may write them again."""
        self._native.wait_offloaded(timeout)

    def wait_delivered(self, timeout: float | None = None) -> None:
        """Until every rollout worker holds this version."""
        self._native.wait_delivered(timeout)

    async def offloaded(self, timeout: float | None = None) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._native.wait_offloaded, timeout)

    async def delivered(self, timeout: float | None = None) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._native.wait_delivered, timeout)


class _Member:
    """What a trainer and a rollout share: registration, join, close."""

    def __init__(self, native: Any):
        self._native = native
        self._cuda_devices: set[Any] = set()  # the torch devices of registered CUDA tensors

    def register(self, name: str, tensor: Any) -> None:
        """Before join: the tensor `name` (ferry keeps a reference to it)."""
        self._register(name, tensor, self._native.register)

    def _register(self, name: str, tensor: Any, native: Any) -> None:
        """Registers `tensor` through `native(name, tensor)`."""
        tensor = _readable(name, tensor)
        native(name, tensor)
        if _is_torch(tensor) and tensor.is_cuda:
            self._cuda_devices.add(tensor.device)

    def register_raw(self, name: str, pointer: int, nbytes: int, dtype: str = "u8", shape: list[int] | None = None,
                     owner: Any = None) -> None:
        """Before join: host memory at `pointer`; `owner` is kept alive with it."""
        self._native.register_raw(name, pointer, nbytes, dtype, shape, owner)

    def join(self) -> None:
        self._native.join()

    def close(self) -> None:
        """Leaves the job (idempotent)."""
        self._native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Trainer(_Member):
    """One trainer shard: register tensors, join, publish versions of them."""

    def __init__(self, coordinator: str, shard: int = 0, secret: str = "", **options: Any):
        super().__init__(_ferry.Trainer(coordinator=coordinator, shard=shard, secret=secret, **options))

    def publish(self, version: int, written: bool = False) -> Update:
        """Publishes `version`, once the current torch stream of each GPU holding a registered
        tensor has done the work queued on it.

        written: the bytes come from `write`, tensor by tensor, straight into ferry's copy (the
        registered tensors, in host memory, then only name the table): each chunk leaves as soon
        as its tensors are written, and the version is offloaded once every tensor is."""
        for device in self._cuda_devices:
            torch.cuda.current_stream(device).synchronize()
        return Update(self._native.publish(version, written))

    def write(self, name: str, tensor: Any, timeout: float | None = None) -> None:
        """Copies `tensor` (host memory, the registered size) into the version published with
        `written=True`, as tensor `name`; waits first until ferry's copy of it may be written."""
        self._native.write(name, _readable(name, tensor), timeout)


class Rollout(_Member):
    """One rollout worker of instance `instance`: receives every version.

    A rollout that registers nothing keeps the trainers' tensors itself: in host memory, or on
    `device` (a CUDA device: index, "cuda:N" or torch.device). `receive` then yields, for each
    tensor, a copy of its bytes in host memory, or with `views=True` (always on a device) a view
    of ferry's memory, valid until the next version lands here."""

    def __init__(self, coordinator: str, instance: int = 0, rank: int = 0, secret: str = "",
                 device: Any = None, views: bool = False, **options: Any):
        super().__init__(_ferry.Rollout(coordinator=coordinator, instance=instance, rank=rank, secret=secret,
                                        device=_device_index(device), **options))
        self._views = views
        self._registered = False
        self._streaming = False
        self._received = 0  # the newest version `receive` went through

    def register(self, name: str, tensor: Any) -> None:
        """Before join: where `name` lands. Registering nothing receives the trainers' table instead;
        registering some tensors receives only those (an expert-parallel shard)."""
        super().register(name, tensor)
        self._registered = True

    def register_rows(self, name: str, tensor: Any, first_row: int, shape: list[int]) -> None:
        """Before join: `tensor` holds rows [first_row, first_row + len(tensor)) of the published
        tensor `name` of `shape` (row-parallel sharding); only those bytes are sent here."""
        self._register(name, tensor,
                       lambda n, t: self._native.register_rows(n, t, first_row, [int(d) for d in shape]))
        self._registered = True

    def register_raw(self, name: str, pointer: int, nbytes: int, dtype: str = "u8", shape: list[int] | None = None,
                     owner: Any = None) -> None:
        """Before join: host memory at `pointer` where `name` lands; `owner` is kept alive with it."""
        super().register_raw(name, pointer, nbytes, dtype, shape, owner)
        self._registered = True

    def join(self) -> None:
        if not self._registered:
            self._native.stream(copy=not self._views)
            self._streaming = True
        super().join()

    @property
    def version(self) -> int:
        """The newest version applied here (0: none)."""
        return self._native.version

    def wait_version(self, version: int, timeout: float | None = None) -> None:
        """Until `version` (or newer) is applied here, CUDA tensors included."""
        self._native.wait_version(version, timeout)

    def receive(self, version: int | None = None, timeout: float | None = None) -> Iterator[tuple[str, Any]]:
        """Each tensor of `version` as (name, tensor), as soon as it is complete here; ends when the
        whole version is. No version: the first one newer than the last received (a rollout that
        joins a running job first gets the job's current version). Only for a rollout that
        registered nothing."""
        receiving = _Receiving(self._streaming, version, self._received)
        while (item := receiving.take(self._native.next_event(timeout))) is not _DONE:
            if item is not None:
                yield item
        self._received = receiving.version

    async def areceive(self, version: int | None = None,
                       timeout: float | None = None) -> AsyncIterator[tuple[str, Any]]:
        """`receive` for asyncio: the event loop runs while this waits."""
        loop = asyncio.get_running_loop()
        receiving = _Receiving(self._streaming, version, self._received)
        while (item := receiving.take(await loop.run_in_executor(None, self._native.next_event, timeout))) is not _DONE:
            if item is not None:
                yield item
        self._received = receiving.version


_DONE = object()


class _Receiving:
    """Follows one version through a rollout's stream of events."""

    def __init__(self, streaming: bool, version: int | None, received: int):
        if not streaming:
            raise InvalidArgument("receive: this rollout registered its tensors; use wait_version")
        self.version = version
        self.received = received  # with no version asked for: the first one newer than this

    def take(self, event: tuple | None) -> Any:
        """A (name, tensor) pair, None for an event of no interest, or _DONE at the version's end."""
        if event is None:
            raise TimedOut(f"receive: nothing of version {self.version or '(next)'} arrived in time")
        kind, version, name, dtype, shape, payload = event
        if self.version is None:
            if version <= self.received:
                return None
            self.version = version
        if version < self.version:  # what is left of an older version
            return None
        if version > self.version:
            raise InvalidArgument(f"receive: version {self.version} was never published here; "
                                  f"version {version} arrived")
        if kind == "failed":
            raise UpdateFailed(payload)
        if kind == "version":
            return _DONE
        return name, _as_array(dtype, shape, payload)
