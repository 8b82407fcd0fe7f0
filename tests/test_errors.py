"""The one line the CLI prints for an error a DataLoader worker raised."""

from __future__ import annotations

import pytest
from torch._utils import ExceptionWrapper

from gptrain.errors import DataError, error_text


def reraised_from_a_worker(error: BaseException) -> BaseException:
    """`error` as torch's DataLoader hands it to the main process: re-created with the worker's
    traceback in its message."""
    try:
        raise error
    except BaseException:
        wrapper = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(BaseException) as caught:
        wrapper.reraise()
    return caught.value


def test_a_workers_gptrain_error_is_its_own_message():
    error = reraised_from_a_worker(DataError("data/x: sample 3 holds token id 5000; prepare it again"))
    assert isinstance(error, DataError) and "Original Traceback" in str(error)
    assert error_text(error) == "data/x: sample 3 holds token id 5000; prepare it again"


def test_a_message_without_its_type_gives_the_tracebacks_last_line_without_the_type():
    text = 'Caught X in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n  File "w.py"\nsome.module.OtherError: the reason\n'
    assert error_text(DataError(text)) == "the reason"
    assert error_text(DataError("plain one line")) == "plain one line"


def ctrl_c() -> None:
    """SIGINT to this process, as Ctrl-C in the terminal sends it."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGINT)


def exit_status(argv: list[str]) -> int:
    """gptrain's exit status for `argv`; a KeyboardInterrupt escaping it fails the test (pytest
    would otherwise take it for the user stopping the session)."""
    import gptrain.cli as cli

    try:
        return cli.main(argv)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped gptrain's main() as a KeyboardInterrupt")


def test_ctrl_c_while_the_commands_are_imported_is_one_line(monkeypatch, capsys):
    """Ctrl-C during the parser's imports (before any command ran) was a KeyboardInterrupt traceback."""
    import gptrain.cli as cli

    def build_parser_interrupted():
        ctrl_c()
        raise AssertionError("SIGINT did not interrupt")

    monkeypatch.setattr(cli, "build_parser", build_parser_interrupted)
    assert exit_status(["plan", "gpt3/126m"]) == 130
    assert capsys.readouterr().err == "gptrain: interrupted\n"


def test_ctrl_c_that_a_library_turns_into_another_error_is_one_line(monkeypatch, capsys):
    """Ctrl-C while torch imports numpy leaves numpy half-imported, and the import fails later with
    "cannot load module more than once per process" (or a RecursionError): that was a traceback."""
    import argparse
    import contextlib
    import signal

    import gptrain.cli as cli

    def swallowing_import(args):
        with contextlib.suppress(KeyboardInterrupt):  # as the interrupted import machinery does
            ctrl_c()
        raise ImportError("cannot load module more than once per process")

    parser = argparse.ArgumentParser(prog="gptrain")
    parser.set_defaults(func=swallowing_import)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert exit_status([]) == 130
    assert capsys.readouterr().err == "gptrain: interrupted\n"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored after the command


def test_an_error_without_ctrl_c_is_still_raised(monkeypatch):
    import argparse

    import gptrain.cli as cli

    def failing(args):
        raise ImportError("a real bug")

    parser = argparse.ArgumentParser(prog="gptrain")
    parser.set_defaults(func=failing)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    with pytest.raises(ImportError, match="a real bug"):
        cli.main([])


def test_training_steps_past_what_the_sample_indices_address_are_one_line_naming_the_keys(tmp_path, capsys):
    """trainer.max_steps=2**62 passes the int64 check; the sample count it asks for overflowed
    numpy (ValueError) or len() (OverflowError) in a traceback."""
    from gptrain.cli import main

    tiny = ["trainer.accelerator=cpu", "trainer.precision=32", "trainer.devices=1", "model.num_layers=1",
            "model.hidden_size=16", "model.num_attention_heads=2", "model.encoder_seq_length=8",
            "model.micro_batch_size=1", "model.global_batch_size=2", "model.data.data_impl=mock",
            "model.data.mock_vocab_size=50", "model.data.data_prefix=null", "model.data.num_workers=0",
            f"exp_manager.explicit_log_dir={tmp_path / 'run'}"]  # fmt: skip
    assert main(["train", "gpt3/126m", *tiny, f"trainer.max_steps={2**62}"]) == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .startswith(
            "gptrain: error: trainer.max_steps x model.global_batch_size: the train split asks for "
            "9,223,372,036,854,775,808 samples of 8 tokens"
        )
    )


@pytest.mark.parametrize("command", ["launch", "train"])
def test_an_override_that_is_not_utf8_is_one_line_naming_it(command, tmp_path, capsys):
    """`base_results_dir=/data/caf\\xe9` from a Latin-1 shell: the launch's config.yaml (and a
    training's hparams.yaml and log) failed to be written with a UnicodeEncodeError traceback."""
    from gptrain.cli import main

    path = f"{tmp_path}/caf\udce9"  # the byte 0xe9, as Python decodes it from argv
    if command == "launch":  # every launch argument is checked first (it reaches launcher_cmd.log)
        argv = ["launch", "--dry-run", "training=gpt3/126m", f"base_results_dir={path}"]
        said = (
            f"the argument 'base_results_dir': 'base_results_dir={tmp_path}/caf\\xe9' is not UTF-8 text "
            "(the byte 0xe9); the job scripts and configs are UTF-8: use a name or path in UTF-8"
        )
    else:
        argv = ["train", "gpt3/126m", f"exp_manager.explicit_log_dir={path}"]
        said = (
            f"override 'exp_manager.explicit_log_dir={tmp_path}/caf\\xe9': byte 0xe9 is not UTF-8, and the "
            "config, its copies and the logs are UTF-8 text; rename the path (or give the value) in UTF-8"
        )
    assert main(argv) == 2
    assert capsys.readouterr().err == f"gptrain: error: {said}\n"
    assert list(tmp_path.iterdir()) == []


def test_a_config_file_path_that_is_not_utf8_is_kept_as_its_bytes_in_cmd_args_log(tmp_path):
    """`train --config-file /d/caf\\xe9.yaml` (the path is not an override, so it may be any bytes)
    stopped the run with a UnicodeEncodeError traceback writing cmd-args.log."""
    from gptrain.train.results import write_run_files

    write_run_files(tmp_path, "run: {}\n", ["gptrain", "train", "--config-file", "/d/caf\udce9 x.yaml"])
    assert (tmp_path / "cmd-args.log").read_bytes() == b"gptrain train --config-file '/d/caf\xe9 x.yaml'\n"


def test_an_output_under_a_file_says_a_directory_is_needed_not_file_exists(tmp_path, capsys, word_corpus):
    """mkdir's "File exists" for `out/x.json` with `out` a file read as a refusal to overwrite."""
    from gptrain.cli import main

    taken = tmp_path / "out"
    taken.write_text("a file the user forgot\n")
    assert main(["plan", "gpt3/126m", "--nodes", "1", "--gpu", "h100-80gb", "--json", f"{taken}/p.json"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"gptrain: error: --json {taken}/p.json: cannot write it ({taken} is not a directory); give a writable path"
    )  # checked before planning since the thirteenth session; the generic line is data merge's below
    prefix, _ = word_corpus
    assert main(["data", "merge", "--input", prefix, "--output-prefix", f"{taken}/merged"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"gptrain: error: {taken}/merged.bin: cannot create the output ({taken}: is a file, where a "
        "directory is needed)"
    )
    assert taken.read_text() == "a file the user forgot\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "out"]  # nothing else written


@pytest.mark.parametrize(
    ("argv", "option", "given"),
    [
        (["eval", "run", "--data-prefix", "1", "a", "--data-prefix", "2", "b"], "data_prefix", ["1", "a", "2", "b"]),
        (["data", "sample", "--seq-length", "8", "--data-prefix", "a", "--data-prefix", "b"], "data_prefix", ["a", "b"]),
        (["data", "prepare", "--input", "x", "--output-prefix", "o", "--json-keys", "text", "--json-keys", "title"],
         "json_keys", ["text", "title"]),
    ],
)  # fmt: skip
def test_a_list_option_given_twice_keeps_both(argv, option, given):
    """`eval --data-prefix 1 A --data-prefix 1 B` evaluated on B alone (argparse keeps the last),
    a loss over half the data asked for, said nowhere; `data sample` sampled B's split alone and
    `data prepare --json-keys text --json-keys title` wrote no text dataset. As --input of data
    prepare/merge already did, each now adds to the list."""
    from gptrain.cli import build_parser

    assert getattr(build_parser().parse_args(argv), option) == given


def test_data_prepare_tokenizes_every_repeated_json_key_and_text_by_default(tmp_path, word_corpus):
    from gptrain.cli import main
    from gptrain.data.indexed import IndexedDataset

    _, tokenizer = word_corpus
    source = tmp_path / "docs.jsonl"
    source.write_text('{"text": "w1 w2 w3", "title": "w4"}\n')
    common = ["data", "prepare", "--input", str(source), "--tokenizer-model", tokenizer]
    assert (
        main([*common, "--output-prefix", f"{tmp_path}/two", "--json-keys", "text", "--json-keys", "title"])
        == 0
    )
    assert IndexedDataset(f"{tmp_path}/two_text_document").num_tokens == 3
    assert IndexedDataset(f"{tmp_path}/two_title_document").num_tokens == 1
    assert main([*common, "--output-prefix", f"{tmp_path}/default"]) == 0
    assert sorted(p.name for p in tmp_path.glob("default_*")) == [
        "default_text_document.bin",
        "default_text_document.idx",
        "default_text_document.tokenizer",
    ]
