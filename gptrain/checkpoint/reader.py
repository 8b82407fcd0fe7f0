"""Loading checkpoints: the newest that verifies and loads at resume, or a given one, on every rank alike.

Every rank verifies its share of the files (sizes and CRC-32s, gptrain.checkpoint.integrity), then
each step of the load that can fail on one rank alone (its rank file, `.metadata` and the state built
for it, the data, applying it) is agreed before the next collective, so all ranks load, or pass over,
the same checkpoint. A checkpoint whose tensors are not the config's is refused before any data is
read; only the vocabulary tensors, whose padding follows TP, are fitted by rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata

from gptrain.checkpoint import architecture as arch
from gptrain.checkpoint import compat
from gptrain.checkpoint.agreement import (
    REFUSED,
    UNREADABLE,
    NotLoaded,
    agreed,
    first_on_any_rank,
    is_distributed,
    refused_verdict,
    steps_of_rank_0,
    world_size,
)
from gptrain.checkpoint.directory import (
    DAMAGED,
    LATEST,
    CheckpointLoadError,
    newest_complete,
    removed_while_read,
    rename_aside,
    step_dir_name,
)
from gptrain.checkpoint.errors import (
    ArchitectureChangedError,
    CheckpointDamagedError,
    CheckpointFromNewerTorchError,
    TokenizerMismatchError,
    root_cause,
)
from gptrain.checkpoint.fit import Fit, agree_fit, local_fit, saved_sections
from gptrain.checkpoint.integrity import (
    is_complete,
    recorded_architecture,
    recorded_tokenizer,
    recorded_torch,
    verify_share,
)
from gptrain.checkpoint.rank_state import rank_file_read, rank_state_from, read_rank_state
from gptrain.checkpoint.replace_recovery import recover_replaced_links
from gptrain.errors import os_error_text
from gptrain.utils.atomic import atomic_write_text

if TYPE_CHECKING:
    from gptrain.data.tokenizer_identity import TokenizerCheck


def read_verified_metadata(path: Path) -> Metadata:
    """`.metadata` of a checkpoint whose files matched their manifest (`verify_share`). One that does not
    unpickle though its CRC-32 matched was written by another torch: CheckpointFromNewerTorchError naming
    both versions where the marker records the one that saved it (a marker from before the record: the
    error as it is, so the checkpoint is passed over as damaged, as before; so is one saved by this
    torch or an older one, where no newer torch would read it)."""
    try:
        return compat.read_metadata(path)
    except (OSError, MemoryError):
        raise  # the disk or the host: judged by `agreed` as before
    except Exception as error:
        saved_with = recorded_torch(path)
        if saved_with is None or not _newer_than_this_torch(saved_with):
            raise  # no newer torch to ask for: a read gone wrong, judged as damage as before
        raise CheckpointFromNewerTorchError(
            f"checkpoint {path}: its .metadata does not load with torch {torch.__version__} "
            f"({root_cause(error)}), though every file matches its manifest: it was saved with torch "
            f"{saved_with}; load it with torch {saved_with} or newer (nothing was renamed)"
        ) from error


def _newer_than_this_torch(version: str) -> bool:
    """Whether `version` (a marker's record) is a newer torch release than this one, builds aside
    (`2.13.0+cu128` is this `2.13.0+cpu`'s release: local labels compare as text, "cpu" < "cu128");
    a version that does not parse is taken as newer (the refusal names it; nothing is renamed)."""
    from torch.torch_version import TorchVersion

    try:
        return TorchVersion(str(torch.__version__).partition("+")[0]) < version.partition("+")[0]
    except Exception:  # packaging's InvalidVersion (torch's vendored copy): not a version to order
        return True


@dataclass
class _Prepared:
    """A checkpoint made ready to load on this rank by local work alone (`CheckpointManager._prepare`)."""

    metadata: Metadata
    saved: dict[str, Any]
    state: dict[str, Any]
    fit: Fit
    staged: dict[str, torch.Tensor]
    """Buffers for the tensors loaded by rows, in their saved shapes."""
    untied: str | None = None
    """After the load on this rank: why the checkpoint's output layer does not fit a tied model."""


class CheckpointReader:
    """Loads the checkpoints under one root for this rank (the loading half of CheckpointManager)."""

    def __init__(
        self,
        root: str | Path,
        rank: int = 0,
        vocab_size: int | None = None,
        tokenizer: TokenizerCheck | None = None,
        tied: bool = False,
        architecture: dict[str, Any] | None = None,
    ) -> None:
        """`vocab_size` is the tokenizer's: rows of the vocabulary tensors at or past it are padding
        (see `read_state`). `tokenizer`: the run's, checked against each checkpoint's record before
        it is loaded (None: no check). `tied`: the model ties its embedding and
        output layer (model.share_embeddings_and_output_weights); under pipeline parallelism the
        last stage holds the output layer's copy alone, and only this tells it to check the
        checkpoint's embedding against its output layer. `architecture`: the run's settings as
        gptrain.checkpoint.architecture records them; a resume refuses a checkpoint recorded with
        others, a start from another run's checkpoint notes them (None: no check)."""
        self.root = Path(root)
        self.rank = rank
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        self.tied = tied
        self.architecture = architecture
        self.notes: list[str] = []  # what a load left out (rows the live model has no room for), to log
        self.resumed: Path | None = None  # the run's own checkpoint load_newest_good loaded

    def newest(self) -> Path | None:
        return newest_complete(self.root)

    def load_newest_good(
        self,
        state_fn: Callable[[set[str]], dict[str, Any]],
        apply: Callable[[dict[str, Any]], None],
        warn: Callable[[str], None],
    ) -> tuple[Path, dict[str, Any]] | None:
        """Load the newest complete checkpoint that verifies and loads; older ones are tried in turn.

        `state_fn` gets the checkpoint's saved keys ('model.tok_embeddings.weight', 'scaler.scale', ...)
        and builds the state to load. Each checkpoint passed over (damaged: it fails its manifest, or
        reading it fails) is reported through `warn`, and once an older one has loaded, moved aside
        (`_move_aside_damaged`). None when there is no complete checkpoint; CheckpointLoadError when
        there are some and none of them loads (nothing is moved); CheckpointMismatchError, at once,
        when the newest sound one holds other tensors than the config builds.
        """
        problems, damaged = [], []
        if self.rank == 0:  # before it lists them: the others wait in steps_of_rank_0's broadcast
            recover_replaced_links(self.root)
        for step in reversed(steps_of_rank_0(self.root)):
            path = self.root / step_dir_name(step)
            loaded = self._verify_and_load(path, state_fn, apply, own_run=True)
            if isinstance(loaded, dict):
                self._point_latest_at(path)  # first: a kill among the renames leaves `latest` sound
                self._move_aside_damaged(damaged, warn)
                self.resumed = path
                return path, loaded
            problem = loaded
            problems.append(problem)
            damaged.append(path)
            warn(f"checkpoint {path.name} is damaged: {problem}; trying the previous one")
        if problems:
            raise CheckpointLoadError(
                f"no checkpoint under {self.root} loads (newest: {problems[0]}); move the damaged ones "
                "aside, or start over with exp_manager.resume_if_exists=false and another run.name"
            )
        return None

    def _point_latest_at(self, resumed: Path) -> None:
        """Rank 0 points `latest` at the checkpoint a resume loaded: a run killed between a save's
        COMPLETE and its `latest` left `latest` one save behind, which it would otherwise stay at
        when the resumed run has nothing left to do."""
        if self.rank != 0:
            return
        with contextlib.suppress(OSError):
            if (self.root / LATEST).read_text().strip() == resumed.name:
                return
        with contextlib.suppress(OSError):  # a read-only run directory still resumes
            atomic_write_text(self.root / LATEST, resumed.name + "\n")

    def _move_aside_damaged(self, damaged: list[Path], warn: Callable[[str], None]) -> None:
        """Rank 0 renames the checkpoints a resume passed over out of the step_<N> names: resume and
        retention then see only the good ones (left as step_<N>, the newest-numbered damaged one
        would outlive the run's new saves); `_point_latest_at` has pointed `latest` at the one it
        resumed, so it never names a renamed one. The damaged data is kept, not deleted, for a look
        at what happened."""
        if self.rank != 0 or not damaged:
            return
        for path in damaged:
            try:
                aside = rename_aside(path, DAMAGED)
            except OSError as error:
                warn(f"could not move the damaged checkpoint {path} aside ({error}); move it by hand")
                continue
            warn(f"moved the damaged checkpoint {path.name} aside to {aside} (kept for inspection)")

    def load_verified(
        self,
        path: Path,
        state_fn: Callable[[set[str]], dict[str, Any]],
        apply: Callable[[dict[str, Any]], None],
    ) -> dict[str, Any]:
        """Load the complete checkpoint `path` (of this run or another) if it verifies, else a one-line
        CheckpointDamagedError naming it (CheckpointMismatchError when it does not fit the config);
        returns this rank's extra state. `state_fn` as for `load_newest_good`."""
        loaded = self._verify_and_load(path, state_fn, apply)
        if not isinstance(loaded, dict) and first_on_any_rank(None if is_complete(path) else "removed"):
            raise removed_while_read(
                path
            )  # another run's retention (eval, or a start from a run in progress)
        if not isinstance(loaded, dict):
            raise CheckpointDamagedError(path, loaded)
        return loaded

    def _verify_and_load(
        self,
        path: Path,
        state_fn: Callable[[set[str]], dict[str, Any]],
        apply: Callable[[dict[str, Any]], None],
        own_run: bool = False,
    ) -> dict[str, Any] | str:
        """This rank's extra state, or what is wrong with `path` (the same verdict on every rank).
        `own_run`: a resume of this run's checkpoint, which refuses changed architecture settings.

        Each step that can fail on one rank alone (reading its rank file, reading `.metadata` and
        building the state, reading the data, applying it) is agreed before the next collective: a
        rank that fell back alone would meet the others' next collective with its agreement (their
        check_fits would take its failure for a config mismatch) or wait until the group timed out.
        """
        try:
            own = refused_verdict(path) or verify_share(path, self.rank, world_size())
        except OSError as error:  # on this rank alone: told to the others in the gather, all stop
            own = UNREADABLE + os_error_text(error, path)
        problem = first_on_any_rank(own)
        if problem is not None and problem.startswith(UNREADABLE):
            raise CheckpointLoadError(
                f"checkpoint {path} could not be read on some rank ({problem.removeprefix(UNREADABLE)}): "
                "not damage, so it is not passed over; fix the file system or the permissions and resume"
            )
        if problem is not None and problem.startswith(REFUSED):
            raise CheckpointLoadError(
                f"checkpoint {path} is not loaded: {problem.removeprefix(REFUSED)} (nothing was renamed)"
            )
        if problem is not None:
            return problem
        self._check_tokenizer(path)
        try:
            rank_file = agreed(path, lambda: rank_file_read(path, self.rank))  # the one a failure names
            extra = agreed(path, lambda: rank_state_from(path, self.rank, rank_file, ranks()), rank_file)
            prepared = agreed(path, lambda: self._prepare(path, state_fn, read_verified_metadata(path)))
            agree_fit(path, prepared.saved, prepared.fit)  # collectives only; a mismatch on every rank
            self._refuse_cut_vocabulary(path, prepared)
            self._check_architecture(path, own_run)  # what shapes cannot tell, before any data is read
            state = agreed(path, lambda: self._load_prepared(path, prepared))
            self._refuse_untied(path, prepared)
            agreed(path, lambda: apply(state))
        except NotLoaded as skipped:
            return str(skipped)
        return extra

    def _check_tokenizer(self, path: Path) -> None:
        """TokenizerMismatchError on every rank when `path` was trained with another tokenizer than
        this run's (one that only adds tokens after the recorded ones is a note); the config's fault,
        not damage, so no older checkpoint is tried."""
        if self.tokenizer is None:
            return
        error, note = self.tokenizer.check(
            recorded_tokenizer(path),
            f"checkpoint {path}",
            "this run's model.tokenizer",
            "point model.tokenizer at the files it was trained with",
        )
        error = first_on_any_rank(error)
        if error is not None:
            raise TokenizerMismatchError(error)
        if note is not None:
            self.notes.append(note)

    def _refuse_cut_vocabulary(self, path: Path, prepared: _Prepared) -> None:
        """TokenizerMismatchError on every rank when this run's vocabulary tensors have fewer rows
        than the tokens `path` records it was trained on (its tokenizer record's vocab_size): those
        trained rows would be dropped, from every later checkpoint too. Rows past it are padding, and
        a checkpoint that records no tokenizer loads as before; exp_manager.allow_tokenizer_change
        loads it anyway (said by `_note_dropped_rows`)."""
        trained = _trained_vocab(path)
        live, _ = compat.flatten(prepared.state)
        keys = [key for key in prepared.fit.rows if key.startswith("model.") and key in live]
        cut = min((live[key].shape[0] for key in keys if compat.is_vocabulary(key)), default=None)
        problem = None
        allowed = self.tokenizer is not None and self.tokenizer.allow_change
        if trained is not None and cut is not None and cut < trained and not allowed:
            problem = (
                f"checkpoint {path} was trained on {trained} tokens (its tokenizer record), this run's "
                f"model has {cut} vocabulary rows: the trained rows {cut}-{trained - 1} would be cut off, "
                "and later checkpoints would not have them; give the run the vocabulary it was trained "
                "with, or set exp_manager.allow_tokenizer_change=true to load it anyway"
            )
        problem = first_on_any_rank(problem)
        if problem is not None:
            raise TokenizerMismatchError(problem)

    def _check_architecture(self, path: Path, own_run: bool) -> None:
        """ArchitectureChangedError on every rank when this run's own checkpoint `path` was saved with
        other architecture settings (a resume goes on training the same model); a note when another
        run's checkpoint is started from (a new run may change them on purpose, such as the rope base
        for longer sequences). Checkpoints saved before the record load unchecked."""
        if self.architecture is None:
            return
        found = arch.changes(recorded_architecture(path), self.architecture)
        problem = first_on_any_rank(arch.mismatch_text(path, found) if found else None)
        if problem is not None and own_run:
            raise ArchitectureChangedError(problem)
        if found:
            self.notes.append(
                f"{path} was trained with other model settings ({'; '.join(found)}): loaded as asked, "
                "into a model that computes something else with these weights"
            )

    def _prepare(
        self, path: Path, state_fn: Callable[[set[str]], dict[str, Any]], metadata: Metadata | None = None
    ) -> _Prepared:
        """This rank's work before loading `path`, without a collective: its `.metadata` (read once),
        the state `state_fn` builds for the saved keys (the optimizer state: the largest allocation of
        start-up), this rank's side of `check_fits`, and the buffers of the tensors loaded by rows."""
        metadata = metadata or compat.read_metadata(path)
        sections = saved_sections(metadata.state_dict_metadata)
        state = state_fn(set(metadata.state_dict_metadata))
        state = {top: value for top, value in state.items() if top in sections}
        saved = compat.saved_metadata(path, metadata)
        fit = local_fit(saved, state)
        flat, _ = compat.flatten(state)
        staged = (
            {}
            if fit.problem
            else {key: torch.empty(shape, dtype=flat[key].dtype) for key, shape in fit.rows.items()}
        )
        return _Prepared(metadata, saved, state, fit, staged)

    def _load_prepared(self, path: Path, prepared: _Prepared) -> dict[str, Any]:
        """DCP load into the prepared state (after `agree_fit`); the tensors fitted by rows copied in.
        A tied model's output layer is loaded into a buffer of its own and compared with the
        embedding (`prepared.untied` says when they differ; the caller agrees on it)."""
        state, staged = prepared.state, prepared.staged
        flat, paths = compat.flatten(state)
        tied = compat.tied_vocabulary(flat)
        apart = torch.empty_like(flat[tied[1]]) if tied and tied[1] not in staged else None
        if tied and apart is not None:
            compat.set_at(state, paths[tied[1]], apart)
        for key, tensor in staged.items():
            compat.set_at(state, paths[key], tensor)
        embedding = self._saved_embedding_beside_output(prepared, flat, paths)
        reader = compat.MetadataReader(path, prepared.metadata)
        dcp.load(state, checkpoint_id=str(path), storage_reader=reader)  # in place; `staged` for the resized
        if embedding is not None:
            at, tensor = embedding
            output = staged.get(compat.OUTPUT, flat[compat.OUTPUT])
            if not torch.equal(compat.local_tensor(tensor), compat.local_tensor(output)):
                prepared.untied = compat.untied_problem(compat.EMBEDDING, compat.OUTPUT)
            compat.drop_at(state, at)
        if tied:
            embedding, output = staged.get(tied[0], flat[tied[0]]), staged.get(tied[1], apart)
            if not torch.equal(compat.local_tensor(embedding), compat.local_tensor(output)):
                prepared.untied = compat.untied_problem(*tied)
            compat.set_at(state, paths[tied[1]], flat[tied[1]])
        for key, tensor in staged.items():
            compat.copy_common_rows(flat[key], tensor, self.vocab_size if compat.is_vocabulary(key) else None)
            compat.set_at(state, paths[key], flat[key])
            self._note_dropped_rows(key, tensor.shape[0], flat[key].shape[0], _trained_vocab(path))
        return state

    def _saved_embedding_beside_output(
        self, prepared: _Prepared, flat: dict[str, Any], paths: dict[str, tuple]
    ) -> tuple[tuple, torch.Tensor] | None:
        """On the last pipeline stage of a tied model (its output layer without the embedding), a
        buffer for the checkpoint's embedding, put into the state beside the output layer: loaded
        with it, then compared (`_load_prepared`). None elsewhere: a tied model in one stage
        compares its one tensor (`compat.tied_vocabulary`), the other stages hold no output layer."""
        output, embedding = compat.OUTPUT, compat.EMBEDDING
        if not self.tied or output not in flat or embedding in flat or embedding not in prepared.saved:
            return None
        like = prepared.staged.get(output, flat[output])
        saved_shape = tuple(prepared.saved[embedding].size)
        if saved_shape != tuple(prepared.saved[output].size):
            prepared.untied = compat.untied_problem(embedding, output)  # not even one shape: not tied
            return None
        at = (*paths[output][:-1], embedding.removeprefix("model."))
        buffer = torch.empty_like(like)
        compat.set_at(prepared.state, at, buffer)
        return at, buffer

    @staticmethod
    def _refuse_untied(path: Path, prepared: _Prepared) -> None:
        """CheckpointMismatchError on every rank when the load found an untied checkpoint on any."""
        problem = first_on_any_rank(prepared.untied)
        if problem is not None:
            raise compat.mismatch_error(path, problem)

    def _note_dropped_rows(self, key: str, saved: int, live: int, trained: int | None = None) -> None:
        """Rows of a model tensor the live one has no room for (fewer padding rows than an imported
        model's, a smaller position table): said, since the next checkpoint no longer has them; and
        positions past the saved table (a larger model.max_position_embeddings), which start untrained.
        `trained`: the tokens the checkpoint records it was trained on (rows below it are not padding,
        whatever this run's vocabulary; dropping them is refused unless allowed)."""
        if key.startswith("model.") and saved < live and not compat.is_vocabulary(key):
            self.notes.append(
                f"{key}: the checkpoint has {saved} rows, this run's model {live}; rows {saved}-{live - 1} "
                "(positions past the saved table) keep their random initialization"
            )
        if not key.startswith("model.") or saved <= live:
            return
        kind = (
            f"padding past the tokenizer's {self.vocab_size} tokens"
            if compat.is_vocabulary(key) and self.vocab_size is not None and live >= self.vocab_size
            else "rows past this run's table"
        )
        if compat.is_vocabulary(key) and trained is not None:
            kind = (
                f"of them {live}-{trained - 1}: tokens the checkpoint was trained on"
                if live < trained
                else f"padding past the {trained} tokens the checkpoint was trained on"
            )
        self.notes.append(
            f"{key}: the checkpoint has {saved} rows, this run's model {live}; rows {live}-{saved - 1} "
            f"({kind}) are not loaded and later checkpoints will not have them"
        )

    def load(
        self, path: Path, state: dict[str, Any], apply: Callable[[dict[str, Any]], None]
    ) -> dict[str, Any]:
        """Load DCP `state` in place, hand it to `apply`, return this rank's extra state (read first:
        nothing is applied from a checkpoint whose rank file does not load)."""
        extra = read_rank_state(path, self.rank, ranks())
        apply(self.read_state(path, state))
        return extra

    def read_state(
        self, path: Path, state: dict[str, Any], metadata: Metadata | None = None
    ) -> dict[str, Any]:
        """DCP `state` loaded in place; what `apply` gets. `metadata`: the checkpoint's, when already
        read (`compat.read_metadata`; read here otherwise, once for the checks and the load).

        A checkpoint whose tensors are not those of `state` is refused before any data is read
        (`check_fits`), except for the rows of the vocabulary tensors: the vocabulary is padded to a
        multiple of make_vocab_size_divisible_by x TP, as Megatron pads it, so it changes with TP.
        Those are loaded as saved and their common rows copied in. Rows only the live state has are
        padding: they take the mean of the saved padding rows (rows at or past `vocab_size`), which
        training pushed to low logits, so the new ones take no more softmax mass than the old did;
        with no saved padding row (or no `vocab_size`) they keep their values.
        Sections of `state` the checkpoint lacks altogether are left out of what `apply` gets:
        a weights-only checkpoint (`gptrain import`) has a 'model' section and nothing else.
        """
        prepared = self._prepare(path, lambda saved: state, metadata)
        agree_fit(path, prepared.saved, prepared.fit)
        state = self._load_prepared(path, prepared)
        self._refuse_untied(path, prepared)
        return state


def _trained_vocab(path: Path) -> int | None:
    """The vocabulary size `path`'s tokenizer record gives; None where it records none."""
    size = (recorded_tokenizer(path) or {}).get("vocab_size")
    return size if isinstance(size, int) else None


def ranks() -> int | None:
    """This run's ranks, where a process group says (a rank's streams depend on it: read_rank_state)."""
    return world_size() if is_distributed() else None
