"""Process limits a long run needs raised before it opens its data."""

from __future__ import annotations

import contextlib
import errno

MOST = 1 << 20
MACOS_OPEN_MAX = 10240


def raise_open_file_limit() -> int | None:
    """Raise the soft limit of open files to the hard one (at most 2**20); the soft limit now
    (None: unknown). An unlimited or higher soft limit is left as it is.

    Each dataset of a blend keeps its .idx and .bin memory-mapped and each split's cached indices
    (3 files): about 11 descriptors per dataset, so a blend of 100 shards passes the common soft
    limit of 1024 while the hard limit is far higher. Megatron runs into the same wall.
    """
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # enough for thousands of shards, not the billion some containers allow: every child inherits
    # it, and tools that walk every descriptor up to the limit crawl
    ceiling = MOST if hard == resource.RLIM_INFINITY else min(hard, MOST)
    if soft == resource.RLIM_INFINITY or soft >= ceiling:
        return soft
    for wanted in (ceiling, MACOS_OPEN_MAX):  # macOS refuses more than OPEN_MAX whatever it says
        if wanted <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            return wanted
        except (ValueError, OSError):
            continue
    return soft


def is_too_many_open_files(error: OSError) -> bool:
    return error.errno in (errno.EMFILE, errno.ENFILE)


def too_many_open_files(path: object, error: OSError) -> str:
    """The one line for running out of file descriptors while opening `path` (not its fault)."""
    if error.errno == errno.ENFILE:
        return (
            f"{path}: the system's table of open files is full (ENFILE); raise fs.file-max on this node "
            "or close what holds them"
        )
    limit = "unknown"
    with contextlib.suppress(ImportError, OSError, ValueError):
        import resource

        limit = str(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    return (
        f"{path}: too many open files (this process may hold {limit}); a blend keeps about 11 per "
        "dataset open: raise the limit (`ulimit -n`, or the hard limit in /etc/security/limits.conf "
        "or the Slurm node's) or merge shards with `gptrain data merge`"
    )


# Maps a blend holds per dataset with its three splits built: the .idx and the .bin, and each split's
# 3 cached index arrays (np.load(mmap_mode="r")); each split's blend adds 2. Measured: 559 for 50.
MAPS_PER_DATASET = 11
_DEFAULT_MAX_MAP_COUNT = 65530  # Linux's, where /proc cannot say


def is_out_of_memory_maps(error: OSError) -> bool:
    """mmap's ENOMEM: the process's maps would pass vm.max_map_count, or its address space is full."""
    return error.errno == errno.ENOMEM


def memory_maps() -> tuple[int | None, int | None]:
    """(memory maps this process holds, vm.max_map_count): None where /proc does not say (not Linux)."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            held = sum(1 for _ in maps)
        with open("/proc/sys/vm/max_map_count") as most:
            return held, int(most.read())
    except (OSError, ValueError):
        return None, None


def out_of_memory_maps(path: object, maps: tuple[int | None, int | None], datasets: int | None = None) -> str:
    """The one line for mmap's ENOMEM while mapping `path` (not its fault). `maps`: memory_maps() when
    it failed (a blend's maps are released as the error leaves it); `datasets`: how many the blend maps."""
    held, limit = maps
    if held is not None and limit is not None and held < limit * 0.9:
        return (
            f"{path}: cannot be memory-mapped (ENOMEM) with {held:,} of the {limit:,} memory maps "
            "vm.max_map_count allows in use: the process's address space limit (`ulimit -v`) or the node's "
            "memory is met; lift the limit where the job starts (`ulimit -v unlimited`)"
        )
    need = f"; a blend maps about {MAPS_PER_DATASET} per dataset"
    if datasets is not None:
        need += (
            f", about {MAPS_PER_DATASET * datasets:,} for its {datasets:,} datasets besides the process's own"
        )
    base = limit or _DEFAULT_MAX_MAP_COUNT
    # room for the process's own maps (torch, CUDA: thousands) besides the blend's
    wanted = max(2 * base, base + MAPS_PER_DATASET * (datasets or 0))
    suggested = 1 << (wanted - 1).bit_length()
    if held is None or limit is None:
        holds = f"may hold all the memory maps vm.max_map_count allows (Linux's default: {base:,})"
    else:
        holds = f"holds {held:,} memory maps, all that vm.max_map_count ({limit:,}) allows"
    return (
        f"{path}: cannot be memory-mapped (ENOMEM): this process {holds}{need}: raise the limit on every node "
        f"(as root: `sysctl -w vm.max_map_count={suggested}`) or merge shards into fewer with `gptrain data merge`"
    )
