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
