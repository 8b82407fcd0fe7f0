"""Fixtures shared by several test folders."""

import os

import pytest
from gloo_ranks import free_port
from hypothesis import settings

# CI (any machine that sets CI, as CI services do) draws the same examples every run, so a red run
# is one the code caused; a developer's run draws new ones each time and may find more.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# What gptrain reads to find its place in a job (torchrun's and Slurm's variables) or to raise
# instead of printing one line. The suite is also run on a node inside an allocation (salloc,
# srun --pty, an sbatch script: the GPU tests need one), where SLURM_NTASKS=8 made every
# one-process training test wait for 7 peers that never came. Tests that want them set them.
JOB_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
JOB_VARIABLES += ("GROUP_RANK", "TORCHELASTIC_RUN_ID", "GPTRAIN_DEBUG")


def is_job_variable(name: str) -> bool:
    """torchrun's, gptrain's debug switch, or Slurm's (but SLURM_CONF, which says where Slurm is)."""
    return name in JOB_VARIABLES or (name.startswith(("SLURM_", "SLURMD_")) and name != "SLURM_CONF")


@pytest.fixture(autouse=True, scope="session")
def outside_any_job():
    """Every test sees the environment of a process started by hand on a machine outside Slurm."""
    with pytest.MonkeyPatch.context() as patch:
        for name in [name for name in os.environ if is_job_variable(name)]:
            patch.delenv(name)
        yield


@pytest.fixture(scope="session")
def stop_signal_handlers_of_the_session():
    import signal

    return {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGUSR1)}


@pytest.fixture(autouse=True)
def stop_signals_as_before(stop_signal_handlers_of_the_session):
    """A run stopped for a requeue ignores SIGTERM/SIGUSR1 until its process exits (its command is
    over); run in-process by a test (or a fixture), the suite gets its own handlers back after it."""
    import signal

    yield
    for signum, handler in stop_signal_handlers_of_the_session.items():
        if handler is not None:  # None: a handler not installed from Python, left as it is
            signal.signal(signum, handler)


@pytest.fixture(scope="module")
def one_torch_thread_per_module():
    """The test machine has 2 shared cores: extra intra-op threads only add contention.

    Module scope, so that module-scoped runs use the same thread count as the tests that
    compare against them (float reductions depend on it, and resume tests compare bits).
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def flock_as_nfs(monkeypatch):
    """flock as Linux's NFS client makes it, a POSIX lock: an exclusive one needs a descriptor open for
    writing, a shared one for reading (EBADF otherwise), and a directory's is never open for writing."""
    import errno
    import fcntl

    real_flock = fcntl.flock

    def flock(descriptor: int, operation: int) -> None:
        access = fcntl.fcntl(descriptor, fcntl.F_GETFL) & os.O_ACCMODE
        needs = os.O_WRONLY if operation & fcntl.LOCK_EX else os.O_RDONLY
        if access not in (needs, os.O_RDWR):
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        real_flock(descriptor, operation)

    monkeypatch.setattr(fcntl, "flock", flock)


@pytest.fixture
def refuse_search(monkeypatch):
    """refuse_search(directory): from then on every path below `directory` fails to stat with `code`
    (EACCES: PermissionError), as where this user may not search it; root may search any directory, so
    the refusal is stood in for. os.stat is what Path.stat, exists, is_dir and os.path ask, whatever
    follow_symlinks= says; `also` names more calls taking the path first, e.g. (os, "open")."""
    import errno

    def refuse(directory, code: int = errno.EACCES, also=()) -> None:
        below = str(directory) + os.sep

        def refusing(real):
            def call(path, *args, **kwargs):
                if not isinstance(path, int) and os.fsdecode(path).startswith(below):
                    raise OSError(code, os.strerror(code), os.fsdecode(path))
                return real(path, *args, **kwargs)

            return call

        for owner, name in [(os, "stat"), *also]:
            monkeypatch.setattr(owner, name, refusing(getattr(owner, name)))

    return refuse


@pytest.fixture
def unsearchable_dir(tmp_path, refuse_search):
    """tmp_path/locked, made, with every path below it refused as `refuse_search` does."""
    locked = tmp_path / "locked"
    locked.mkdir()
    refuse_search(locked)
    return locked


def write_word_corpus(directory, documents, words: int = 60) -> tuple[str, str]:
    """(prefix, tokenizer.json): `documents` (arrays of ids 1..words, EOD 0 appended to each) as a
    Megatron .bin/.idx corpus under `directory`, and the word-level HF tokenizer of w0..w{words-1}."""
    import numpy as np
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    from gptrain.data.indexed import IndexedDatasetWriter

    directory.mkdir(parents=True, exist_ok=True)
    vocab = {"<|endoftext|>": 0} | {f"w{i}": i + 1 for i in range(words)}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    prefix = str(directory / "corpus_text_document")
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for doc in documents:
            writer.add_document(np.append(doc, 0).astype(np.uint16))
    return prefix, str(directory / "tokenizer.json")


def word_corpus_documents() -> list:
    """80 documents of random words (ids 1..60), 5 to 39 words each, the same every call."""
    import numpy as np

    rng = np.random.default_rng(0)
    return [rng.integers(1, 61, size=int(rng.integers(5, 40))) for _ in range(80)]


@pytest.fixture
def word_corpus(tmp_path):
    """(prefix, tokenizer.json): a real Megatron .bin/.idx corpus of 80 EOD-terminated documents
    of random words from a 61-word vocabulary and its word-level HF tokenizer, under tmp_path/data."""
    return write_word_corpus(tmp_path / "data", word_corpus_documents())


@pytest.fixture
def indexed_corpus(word_corpus):
    """Overrides that train on `word_corpus` (split 90,10,0, index cache beside it)."""
    return corpus_overrides(*word_corpus)


@pytest.fixture(scope="module")
def module_indexed_corpus(tmp_path_factory):
    """`indexed_corpus` for a module's shared runs: its own directory, its index cache unbuilt."""
    return corpus_overrides(*write_word_corpus(tmp_path_factory.mktemp("data"), word_corpus_documents()))


def corpus_overrides(prefix: str, tokenizer: str) -> list[str]:
    """Overrides that train on a corpus written by `write_word_corpus`."""
    return [
        "model.data.data_impl=mmap",
        f"model.data.data_prefix={prefix}",
        "model.data.splits_string=90,10,0",
        f"model.data.index_mapping_dir={prefix}-index",
        "model.data.eod_mask_loss=true",
        "model.tokenizer.library=huggingface",
        "model.tokenizer.type=HuggingFaceTokenizer",
        f"model.tokenizer.model={tokenizer}",
        "model.tokenizer.vocab_file=null",
        "model.tokenizer.merge_file=null",
    ]


@pytest.fixture
def corpus_writer():
    """write(directory, documents) -> overrides training on them (see `write_word_corpus`)."""

    def write(directory, documents) -> list[str]:
        return corpus_overrides(*write_word_corpus(directory, documents))

    return write


@pytest.fixture
def torchrun():
    """torchrun(n): the command line that starts n local processes on a free port (append '-m', ...)."""
    import sys

    def command(processes: int) -> list[str]:
        port = free_port()
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={processes}",
            f"--master-port={port}",
        ]

    return command


def sentencepiece_lines(count: int = 1500) -> list[str]:
    """Sentences of made-up words (fixed seed): enough variety for a few hundred pieces."""
    import random

    rng = random.Random(0)
    syllables = ["ka", "to", "ri", "shu", "men", "la", "qua", "zer", "ion", "ed", "ing", "th", "pé", "ü"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(300)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + "." for _ in range(count)]


def _train_sentencepiece(directory, vocab_size: int = 250, **options) -> str:
    """A unigram tokenizer.model trained here, offline, in well under a second; its path."""
    spm = pytest.importorskip("sentencepiece")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "corpus.txt").write_text("\n".join(sentencepiece_lines()) + "\n", encoding="utf-8")
    prefix = directory / "tokenizer"
    spm.SentencePieceTrainer.train(
        input=str(directory / "corpus.txt"), model_prefix=str(prefix), vocab_size=vocab_size,
        minloglevel=2, **options,
    )  # fmt: skip
    return f"{prefix}.model"


@pytest.fixture(scope="session")
def train_sentencepiece():
    return _train_sentencepiece


@pytest.fixture(scope="session")
def sp_model(tmp_path_factory) -> str:
    """A 250-piece model with sentencepiece's default specials: <unk> 0, <s> 1, </s> 2, no pad."""
    return _train_sentencepiece(tmp_path_factory.mktemp("spm"))


@pytest.fixture(scope="session")
def sentencepiece_sentences():
    return sentencepiece_lines
