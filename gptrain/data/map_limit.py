"""Running out of memory maps: a blend maps about 11 files per dataset, and Linux allows a process
65,530 maps by default (vm.max_map_count), met near 5,500 shards."""

from __future__ import annotations

from gptrain.errors import DataError
from gptrain.utils import limits


class OutOfMemoryMaps(DataError):
    """mmap's ENOMEM while mapping `path`, with the process's (maps held, vm.max_map_count) then: the
    builder, which knows how many datasets its blend maps, says it again with that count."""

    def __init__(
        self, path: object, maps: tuple[int | None, int | None], datasets: int | None = None
    ) -> None:
        super().__init__(limits.out_of_memory_maps(path, maps, datasets))
        self.path, self.maps, self.datasets = path, maps, datasets

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:  # pickled whole (multiprocessing)
        return type(self), (self.path, self.maps, self.datasets)

    @classmethod
    def now(cls, path: object) -> OutOfMemoryMaps:
        """The error for a map of `path` that just failed, with the process's maps counted now."""
        return cls(path, limits.memory_maps())

    def of_blend(self, datasets: int) -> OutOfMemoryMaps:
        """The same failure, saying how many maps a blend of `datasets` needs."""
        return OutOfMemoryMaps(self.path, self.maps, datasets)
