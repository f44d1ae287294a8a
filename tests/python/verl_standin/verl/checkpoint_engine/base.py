"""The interface of verl/checkpoint_engine/base.py (verl >= 0.9) that a backend implements and
registers with; verl's own module also holds its Ray workers and manager, which need Ray and are
left out. The call order verl follows is in tests/python/verl_job.py."""
from abc import ABC, abstractmethod
from typing import Any, Generator


class CheckpointEngineRegistry:
    _registry: dict[str, type["CheckpointEngine"]] = {}

    def register(backend: str):
        def wrapper(cls):
            CheckpointEngineRegistry._registry[backend] = cls
            return cls

        return wrapper

    @classmethod
    def get(cls, backend: str) -> type["CheckpointEngine"]:
        return cls._registry[backend]

    @classmethod
    def new(cls, backend: str, *args, **kwargs) -> "CheckpointEngine":
        if backend not in cls._registry:
            raise ValueError(f"Checkpoint engine {backend} not registered")
        return cls._registry[backend](*args, **kwargs)


class CheckpointEngine(ABC):
    @abstractmethod
    def prepare(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    @abstractmethod
    def build_topology(cls, trainer_world_size: int, rollout_world_size: int,
                       metadata: list[dict]) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        raise NotImplementedError

    @abstractmethod
    def init_process_group(self, **kwargs):
        raise NotImplementedError

    @abstractmethod
    def finalize(self):
        raise NotImplementedError

    @abstractmethod
    async def send_weights(self, weights: Generator[tuple[str, Any], None, None]):
        raise NotImplementedError

    @abstractmethod
    async def receive_weights(self) -> Generator[tuple[str, Any], None, None]:
        raise NotImplementedError
