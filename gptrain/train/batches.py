"""Batches for training: the data helper's numpy samples as tokens/labels/loss_mask tensors.

The sampler is Megatron's pretraining sampler: it walks the sample indices in order
from `consumed_samples`, so a resumed run sees exactly the batches an uninterrupted
run would, and each data-parallel rank takes its own slice of every global micro-step.
"""

from __future__ import annotations

import atexit
import contextlib
import re
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from gptrain.errors import DataError, GptrainError
from gptrain.train.signals import ignore_stop_signals


class LoaderWorkerDied(GptrainError):
    """A DataLoader worker process ended under the run (the OOM killer, a crash)."""


# torch's words (its C++ SIGCHLD check, and dataloader.py's for a worker gone without a signal)
_WORKER_DIED = re.compile(
    r"DataLoader worker \(pid(?:\(s\))? (?P<pids>[\d, ]+)\) "
    r"(?:is killed by signal: (?P<signal>[^.]+)\.|exited unexpectedly(?: with exit code (?P<code>-?\d+))?)"
)


def loader_worker_died(error: BaseException, wait_s: float = 0.0) -> LoaderWorkerDied | None:
    """The one line for a DataLoader worker that died, or None for any other error. torch raises a
    RuntimeError over the connection the death broke (two tracebacks of some 60 lines, exit 1), or,
    when its SIGCHLD check comes later, that connection's error alone ('Connection reset by peer',
    EOFError): then torch's check is asked for up to `wait_s`, while the loader knows its workers."""
    match = next((m for e in _chain(error) if (m := _WORKER_DIED.search(str(e)))), None)
    if match is None and isinstance(error, ConnectionError | EOFError):
        match = _worker_death_seen_within(wait_s)
    if match is None:
        return None
    return LoaderWorkerDied(f"a DataLoader worker (pid {match['pids']}) {_death_and_remedy(match)}")


def _death_and_remedy(match: re.Match[str]) -> str:
    """How the worker ended and what to do, by torch's words: SIGKILL is the out-of-memory killer's,
    SIGBUS a full /dev/shm (torch says so too), anything else the worker's own error."""
    resume = "then resume from the last checkpoint"
    if match["signal"] == "Killed":
        return (
            "was killed by signal Killed (SIGKILL: most likely the kernel's out-of-memory killer): give "
            f"the job more host memory or lower model.data.num_workers, {resume}"
        )
    if match["signal"] == "Bus error":
        return (
            "was killed by signal Bus error (most likely shared memory ran out: /dev/shm, a container's "
            f"--shm-size): raise that limit or lower model.data.num_workers, {resume}"
        )
    how = f"was killed by signal {match['signal']}" if match["signal"] else "exited unexpectedly"
    if match["code"] is not None:
        how += f" with exit code {match['code']}"
    return f"{how}: model.data.num_workers=0 shows the worker's own error in the run, {resume}"


def _worker_death_seen_within(wait_s: float) -> re.Match[str] | None:
    """torch's own check of this process's loader workers, until one is seen dead or `wait_s` ends:
    a worker's broken connection can arrive before the kernel shows it as exited."""
    deadline = time.monotonic() + wait_s
    try:
        while True:
            torch._C._error_if_any_worker_fails()
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)
    except RuntimeError as seen:  # from the check, or from torch's SIGCHLD handler meanwhile
        return _WORKER_DIED.search(str(seen))


def raise_if_a_worker_died(error: BaseException, iterator: object) -> None:
    """LoaderWorkerDied for `error` when a worker of `iterator` died, its other workers shut down
    first: their pids leave torch's SIGCHLD check, which would raise the death again, as a
    traceback, from whatever the run's cleanup is doing when the signal comes."""
    died = loader_worker_died(error, wait_s=2.0)
    if died is None:
        return
    shut_down_workers(iterator)
    raise died from None


def shut_down_workers(iterator: object) -> None:
    """End the worker processes of a DataLoader iterator now (what its __del__ would do), if it has any."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        with contextlib.suppress(
            Exception
        ):  # nor hide the error being raised, nor keep other loaders' workers
            shutdown()


def _chain(error: BaseException) -> Iterator[BaseException]:
    """`error` and the errors it was raised from or while handling."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


class GPTBatchDataset(Dataset):
    """Splits a sample of seq_length+1 tokens into inputs and next-token labels."""

    def __init__(
        self,
        samples: Sequence[Any],
        eod: int | None = None,
        eod_mask_loss: bool = False,
        vocab_rows: int | None = None,
        source: str = "the data",
        pad: int | None = None,
        null_vocab: int | None = None,
    ) -> None:
        self.samples = samples
        self.eod = eod
        self.eod_mask_loss = eod_mask_loss and eod is not None
        self.vocab_rows = vocab_rows  # the embedding's rows: a larger token id has none
        self.source = source  # what names the data in an error: a config key or a flag
        self.pad = pad if pad is not None and pad >= 0 else None  # NullTokenizer's; -1: none
        # NullTokenizer's vocab_size: nothing else bounds its data's ids (a large corpus is not read at
        # the start, gptrain.data.token_bound); the same max is held to it instead of to the rows
        self.null_vocab = null_vocab
        self.id_limit = null_vocab if null_vocab is not None else vocab_rows
        self.built_for: int | None = None  # the samples the split was built for (builders sets it)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        sample = torch.from_numpy(np.asarray(self.samples[index], dtype=np.int64))
        if self.id_limit is not None and sample.numel():
            self._check_ids(index, sample)
        tokens, labels = sample[:-1], sample[1:]
        loss_mask = torch.ones(tokens.shape, dtype=torch.float32)
        if self.eod_mask_loss:
            # Megatron masks the positions whose *input* is EOD.
            loss_mask[tokens == self.eod] = 0.0
        if self.pad is not None:
            tokens, labels = self._mask_padding(tokens, labels, loss_mask)
        return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask}

    def _mask_padding(
        self, tokens: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As Megatron's GPT dataset with a padding id: labels of it leave the loss, and it reads as
        id 0 in tokens and labels."""
        loss_mask[labels == self.pad] = 0.0
        return tokens.masked_fill(tokens == self.pad, 0), labels.masked_fill(labels == self.pad, 0)

    def _check_ids(self, index: int, sample: torch.Tensor) -> None:
        """An id the embedding has no row for fails here in one line, not as an index error deep in
        the model (a device-side assert on a GPU)."""
        low, high = (int(v) for v in torch.aminmax(sample))
        if low < 0:
            raise DataError(
                f"{self.source}: sample {index} holds token id {low}, and no token id is negative: a "
                "dataset's .bin is damaged, or its .idx names a signed token dtype the tokens were not written in (a foreign or corrupt .idx); prepare the data again"
            )
        if high >= self.id_limit and self.null_vocab is not None:
            from gptrain.data.token_bound import sample_past_vocabulary

            raise sample_past_vocabulary(self.samples, index, high, self.null_vocab, self.source)
        if high >= self.id_limit:
            raise DataError(
                f"{self.source}: sample {index} holds token id {high}, but the model's "
                f"vocabulary has {self.vocab_rows} rows: the data was tokenized with another, larger "
                "tokenizer than the run's model.tokenizer; train with the tokenizer `gptrain data "
                "prepare` used, or prepare the data again with this one"
            )


class ResumableMicroBatchSampler(Sampler[list[int]]):
    """Index lists of one micro-batch for rank `dp_rank`, starting at `consumed_samples`.

    Each global micro-step takes micro_batch_size * dp_size consecutive samples; rank r
    gets the r-th slice. An incomplete last micro-step is dropped.
    """

    def __init__(
        self,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        dp_rank: int = 0,
        dp_size: int = 1,
    ) -> None:
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank {dp_rank} outside [0, {dp_size})")
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.dp_rank, self.dp_size = dp_rank, dp_size

    def __len__(self) -> int:
        remaining = max(0, self.total_samples - self.consumed_samples)
        return remaining // (self.micro_batch_size * self.dp_size)

    def __iter__(self) -> Iterator[list[int]]:
        stride = self.micro_batch_size * self.dp_size
        offset = self.dp_rank * self.micro_batch_size
        for base in range(self.consumed_samples, self.total_samples - stride + 1, stride):
            yield list(range(base + offset, base + offset + self.micro_batch_size))


def build_loader(
    dataset: GPTBatchDataset,
    consumed_samples: int,
    micro_batch_size: int,
    dp_rank: int = 0,
    dp_size: int = 1,
    num_workers: int = 0,
    total_samples: int | None = None,
    seed: int = 0,
    pin_memory: bool = False,
) -> DataLoader:
    """A DataLoader of micro-batches (dicts of [micro, seq] tensors) for this rank.

    It gets its own generator: creating an iterator then draws nothing from the global
    torch RNG, which dropout uses, so a resumed run's random streams match.
    """
    sampler = ResumableMicroBatchSampler(
        total_samples if total_samples is not None else len(dataset),
        consumed_samples,
        micro_batch_size,
        dp_rank,
        dp_size,
    )
    loader = DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory,  # for a CUDA run only: pinning touches GPU 0 on a CPU run's GPU host
        persistent_workers=num_workers > 0,
        worker_init_fn=ignore_stop_signals if num_workers > 0 else None,
        generator=torch.Generator().manual_seed(seed),
    )
    if num_workers > 0:
        _track_workers(loader)
    return loader


_LOADERS_WITH_WORKERS: weakref.WeakSet[DataLoader] = weakref.WeakSet()


def _track_workers(loader: DataLoader) -> None:
    """Shut `loader`'s workers down at exit if it is still alive then. A run that fails while its
    loader is still referenced (the error's traceback holds the frames) otherwise hangs at exit:
    multiprocessing terminates the workers with SIGTERM, which they ignore (ignore_stop_signals),
    and then waits for them forever."""
    if not _LOADERS_WITH_WORKERS:
        atexit.unregister(_shut_down_workers)  # registered once, and last: runs before multiprocessing's hook
        atexit.register(_shut_down_workers)
    _LOADERS_WITH_WORKERS.add(loader)


def _shut_down_workers() -> None:
    for loader in list(_LOADERS_WITH_WORKERS):
        shut_down_workers(getattr(loader, "_iterator", None))  # a persistent_workers loader keeps it
    _LOADERS_WITH_WORKERS.clear()
