"""`gptrain logs` reaches every launch into a run directory, not only the latest."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from gptrain.cli import main
from gptrain.launch import job_logs, run_dirs, slurm_queries, status
from gptrain.launch.records import append_record
from gptrain.launch.sbatch import Job


def local_launch(run: Path, stages: list[str], pid: int, texts: list[str], old: bool = False) -> None:
    """A finished local launch's records and logs (`old`: records written before `dependency`)."""
    after = None
    for number, (stage, text) in enumerate(zip(stages, texts, strict=True)):
        job_id, log = f"local-{pid + number}", run / f"log-{stage}_{pid + number}.out"
        log.write_text(text)
        fields = {"stage": stage, "executor": "local", "job_id": job_id, "pid": pid + number, "log": str(log)}
        append_record(run, "submitted", **fields, **({} if old else {"dependency": after}))
        append_record(run, "finished", job_id=job_id, stage=stage, exit_code=0)
        after = job_id


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """Three launches: validation and training; validation alone (it failed); both again."""
    run = tmp_path / "results" / "r"
    run.mkdir(parents=True)
    local_launch(run, ["validation", "training"], 100, ["v1\n", "t1\n"], old=True)
    local_launch(run, ["validation"], 200, ["v2\n"])
    local_launch(run, ["validation", "training"], 300, ["v3\n", "t3\n"])
    return run


def logs(capsys: pytest.CaptureFixture[str], run: Path, *options: str) -> tuple[int, str, str]:
    code = main(["logs", str(run), *options])
    out, err = capsys.readouterr()
    return code, out, err


def labelled(run: Path, *logs: tuple[str, str, str]) -> str:
    """Several logs as `gptrain logs` prints them: each (stage, job id, text) under its header."""
    text = ""
    for stage, job, body in logs:
        text += f"==> {stage} job local-{job}: {run}/log-{stage}_{job}.out <==\n{body}"
    return text


def test_each_launch_is_reachable_and_the_default_is_the_latest(run, capsys):
    latest = labelled(run, ("validation", "300", "v3\n"), ("training", "301", "t3\n"))
    assert logs(capsys, run) == (0, latest, "")  # the latest job of each stage
    first = labelled(run, ("validation", "100", "v1\n"), ("training", "101", "t1\n"))
    for option, text in (("1", first), ("2", "v2\n"), ("3", latest), ("-1", latest)):
        assert logs(capsys, run, "--launch", option) == (0, text, ""), option
    assert logs(capsys, run, "--launch", "-3", "--stage", "training") == (0, "t1\n", "")


def test_all_prints_each_launch_under_a_header(run, capsys):
    code, out, _ = logs(capsys, run, "--all")
    headers = [line for line in out.splitlines() if line.startswith("==> launch ")]
    assert code == 0 and len(headers) == 3
    assert headers[0].startswith("==> launch 1 of 3, ")
    assert headers[0].endswith(": validation job local-100, training job local-101 <==")
    assert headers[1].endswith(": validation job local-200 <==")
    first = labelled(run, ("validation", "100", "v1\n"), ("training", "101", "t1\n"))
    assert out.split("\n", 1)[1].startswith(first + "==> launch 2 of 3")
    assert out.endswith(
        "training job local-301 <==\n"
        + labelled(run, ("validation", "300", "v3\n"), ("training", "301", "t3\n"))
    )
    _, out, _ = logs(capsys, run, "--all", "--stage", "training")  # launch 2 had no training
    assert [line[:16] for line in out.splitlines() if line.startswith("==> ")] == [
        "==> launch 1 of ",
        "==> launch 3 of ",
    ]


@pytest.mark.parametrize("number", ["0", "4", "-4"])
def test_a_launch_that_does_not_exist_is_a_one_line_error_naming_the_range(run, capsys, number):
    code, out, err = logs(capsys, run, "--launch", number)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and f"--launch {number}" in err and "1..3" in err and "-3..-1" in err


@pytest.mark.parametrize("options", [[], ["--all"], ["-f"], ["--stage", "training"]])
def test_a_run_dir_with_no_job_yet_is_a_one_line_error_not_an_empty_log(tmp_path, capsys, options):
    """A run dir whose launch stopped before it submitted a job (its launcher.log records none):
    `gptrain logs` printed an empty line and exited 0, as if the job had logged nothing."""
    run = tmp_path / "results" / "r"
    run.mkdir(parents=True)
    (run / "launcher.log").write_text("")
    said = f"gptrain: error: {run}: nothing launched yet (launcher.log records no job), so there is no log to show\n"
    assert logs(capsys, run, *options) == (2, "", said)


def test_slurm_launches_are_told_apart_by_their_dependency(tmp_path):
    """A stage submitted after another of the same launch names its job; a requeue adds no record."""
    slurm = {"executor": "slurm", "log": f"{tmp_path}/log-r_%j.out"}
    append_record(tmp_path, "submitted", stage="validation", job_id="10", dependency=None, **slurm)
    append_record(tmp_path, "submitted", stage="training", job_id="11", dependency="10", **slurm)
    # the next launch's data preparation writes to its own run dir: training waits for its job 15
    append_record(tmp_path, "submitted", stage="training", job_id="16", dependency="15", **slurm)
    assert [[r["job_id"] for r in launch] for launch in run_dirs.launches(tmp_path)] == [["10", "11"], ["16"]]


def test_a_local_launch_records_the_stage_each_stage_ran_after(tmp_path):
    """A launch of training alone after one of validation alone is a launch of its own."""
    from gptrain.launch.executors.local import run

    def plan(*stages: str) -> SimpleNamespace:
        stage_jobs = [Job(stage, stage, stage, tmp_path, []) for stage in stages]
        for job in stage_jobs:
            job.script_path.write_text(f"echo {job.stage}\n")
        return SimpleNamespace(jobs=stage_jobs)

    for stages in (["validation", "training"], ["validation"], ["training"]):
        assert run(plan(*stages), echo=False) == 0
    launches = [[r["stage"] for r in launch] for launch in run_dirs.launches(tmp_path)]
    assert launches == [["validation", "training"], ["validation"], ["training"]]


def test_follow_prints_what_a_job_wrote_just_before_it_ended(tmp_path, capsys):
    """The job's last lines, written between a read and the check that it ended, were dropped."""
    log = tmp_path / "log.out"
    log.write_text("step 1\n")

    def ends_after_writing() -> bool:
        if "finished" not in log.read_text():  # the job's last line, then it ends
            with open(log, "a") as handle:
                handle.write("gptrain: step finished with exit code 0\n")
        return True

    job_logs.follow(lambda: [log], ends_after_writing, poll=0)
    assert capsys.readouterr().out.endswith("gptrain: step finished with exit code 0\n")


def test_follow_asks_for_the_jobs_state_only_when_its_log_is_quiet(tmp_path, capsys):
    """A growing log made follow ask squeue on every pass, tens of times a second for a chatty job."""
    log = tmp_path / "log.out"
    log.write_text("")
    reads, asked = [], []

    def paths() -> list:
        reads.append(1)
        if len(reads) <= 500:  # the job writes a line before each of the first 500 reads
            with open(log, "a") as handle:
                handle.write("iteration line\n")
        return [log]

    def is_done() -> bool:
        asked.append(1)
        return len(asked) > 1

    job_logs.follow(paths, is_done, poll=0)
    assert capsys.readouterr().out == "iteration line\n" * 500
    assert len(asked) == 2  # once when the log went quiet (running), once more (done)


def test_follow_returns_for_a_stage_that_waits_on_a_failed_one(tmp_path, capsys, monkeypatch):
    """`gptrain logs -f` on a training pending with DependencyNeverSatisfied (its data preparation
    failed) waited for ever: that job never starts, so there is nothing to follow."""
    import subprocess

    log = f"{tmp_path}/log-r_%j.out"
    append_record(
        tmp_path, "submitted", stage="training", executor="slurm", job_id="11", dependency="10", log=log
    )

    def squeue(command, timeout=15.0):
        return subprocess.CompletedProcess(command, 0, "11|PENDING|DependencyNeverSatisfied\n", "")

    polls = []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        assert len(polls) < 20, "still following a job that never starts"

    monkeypatch.setattr(slurm_queries, "run_command", squeue)
    monkeypatch.setattr(job_logs.time, "sleep", sleep)
    assert main(["logs", str(tmp_path), "-f"]) == 0
    err = capsys.readouterr().err
    assert "training job 11 waits on job 10, which failed: it never starts; gptrain cancel it" in err


def test_with_stderr_apart_logs_and_status_read_the_err_file_too(tmp_path, capsys, monkeypatch):
    """cluster.stderr_to_stdout=false sends stderr to log-<job>_<id>.err: `gptrain logs` showed the
    .out alone (no traceback, no one-line error), and status of a job Slurm had forgotten found no
    exit line there, so an ended training was UNKNOWN."""
    import subprocess

    run = tmp_path / "results" / "r"
    run.mkdir(parents=True)
    append_record(run, "submitted", stage="training", executor="slurm", job_id="7",
                  log=str(run / "log-r_%j.out"), dependency=None)  # fmt: skip
    (run / "log-r_7.out").write_text("iteration 1\n")
    (run / "log-r_7.err").write_text(
        "gptrain: error: no such file\ngptrain: step finished with exit code 2\n"
    )
    out = "iteration 1\ngptrain: error: no such file\ngptrain: step finished with exit code 2\n"
    out = f"==> training job 7: {run}/log-r_7.out <==\n" + out.replace(
        "gptrain: error", f"==> training job 7: {run}/log-r_7.err <==\ngptrain: error", 1
    )
    assert logs(capsys, run) == (0, out, "")

    def forgotten(command, timeout=15.0):  # squeue, scontrol past MinJobAge; sacct without slurmdbd
        return subprocess.CompletedProcess(command, 1, "", "Invalid job id specified")

    monkeypatch.setattr(slurm_queries, "run_command", forgotten)
    [line] = status.status_lines(run)
    assert line == "r  training  job 7  FAILED (Slurm no longer knows the job; from its log) exit 2:0"


def test_a_log_larger_than_the_memory_given_is_printed_whole(tmp_path):
    """`gptrain logs` read each log whole into memory: a job of many ranks writes gigabytes, and on a
    login node that limits a command's memory it died of a MemoryError. It prints a piece at a time."""
    import resource
    import subprocess
    import sys

    run = tmp_path / "r"
    run.mkdir()
    log = run / "log-r_7.out"
    size = 128 << 20  # a sparse file: no disk used; its text (NUL bytes) twice over passes the limit
    with open(log, "wb") as handle:
        handle.truncate(size - 5)
        handle.seek(size - 5)
        handle.write(b"last\n")
    append_record(run, "submitted", stage="training", executor="local", job_id="local-7", pid=7, log=str(log))
    code = "import sys; from gptrain.cli import main; sys.exit(main(['logs', sys.argv[1]]))"

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (224 << 20, 224 << 20))

    done = subprocess.run(
        [sys.executable, "-c", code, str(run)], capture_output=True, preexec_fn=limit_memory, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()[-300:]
    assert len(done.stdout) == size and done.stdout.endswith(b"\x00last\n")


def test_a_stage_the_run_has_no_job_of_is_a_one_line_error_saying_where_it_ran(tmp_path, capsys):
    """`gptrain logs RUN --stage data_preparation` on a training's run printed nothing and exited 0,
    as if the job had written nothing: its data preparation ran in a run dir of its own."""
    prep, train = tmp_path / "download_shards", tmp_path / "r"
    prep.mkdir(), train.mkdir()
    append_record(train, "submitted", stage="training", executor="slurm", job_id="11",
                  log=str(train / "log-r_%j.out"), dependency="10", dependency_dir=str(prep))  # fmt: skip
    assert logs(capsys, train, "--stage", "data_preparation") == (
        2,
        "",
        f"gptrain: error: --stage data_preparation: no data_preparation job in {train}; this run's data"
        f" preparation ran in {prep}: gptrain logs {prep}\n",
    )
    code, _, err = logs(capsys, train, "--stage", "validation", "--launch", "1")
    assert (code, err) == (
        2,
        f"gptrain: error: --stage validation: no validation job in launch 1 of {train}\n",
    )


def test_a_job_without_a_log_file_is_said_not_passed_over(tmp_path, capsys):
    """`gptrain logs RUN` right after a Slurm submission (the job pending, no log yet), or after a log
    was removed, printed nothing of that job and exited 0, as if it had logged nothing."""
    run = tmp_path / "r"
    run.mkdir()
    slurm = {"executor": "slurm", "dependency": None}
    append_record(run, "submitted", stage="validation", job_id="12", log=str(run / "log-v_%j.out"), **slurm)
    append_record(run, "submitted", stage="training", job_id="13", log=str(run / "log-t_%j.out"), **slurm)
    (run / "log-v_12.out").write_text("validation passed\n")
    note = "(a job not started yet has written none; gptrain status says its state)\n"
    assert logs(capsys, run, "--stage", "training") == (
        0,
        "",
        f"gptrain: training job 13: no log at {run}/log-t_13.out {note}",
    )
    assert logs(capsys, run) == (
        0,
        "validation passed\n",
        f"gptrain: training job 13: no log at {run}/log-t_13.out {note}",
    )


def test_several_logs_are_told_apart_by_a_header_naming_stage_job_and_file(tmp_path, capsys):
    """The latest job of each stage, and every array task, ran together with nothing between them:
    a preparation task's last line ran into the next task's first, and into the training's log."""
    run = tmp_path / "r"
    run.mkdir()
    slurm = {"executor": "slurm", "dependency": None}
    append_record(run, "submitted", stage="data_preparation", job_id="12", array=2,
                  log=str(run / "log-p_%A_%a.out"), **slurm)  # fmt: skip
    append_record(run, "submitted", stage="training", job_id="13", log=str(run / "log-t_%j.out"), **slurm)
    (run / "log-p_12_0.out").write_text("shard 0 done")  # no newline at its end (a killed task)
    (run / "log-p_12_1.out").write_text("shard 1 done\n")
    (run / "log-t_13.out").write_text("iteration 1\n")
    assert logs(capsys, run) == (
        0,
        f"==> data_preparation job 12_0: {run}/log-p_12_0.out <==\nshard 0 done\n"
        f"==> data_preparation job 12_1: {run}/log-p_12_1.out <==\nshard 1 done\n"
        f"==> training job 13: {run}/log-t_13.out <==\niteration 1\n",
        "",
    )
    assert logs(capsys, run, "--stage", "training") == (0, "iteration 1\n", "")  # one log: as it is


def test_follow_names_the_log_it_switches_to(tmp_path, capsys):
    """-f of several logs: a header each time the text comes from another file than the last."""
    one, two = tmp_path / "log-r_1_0.out", tmp_path / "log-r_1_1.out"
    one.write_text("a")
    writes = iter([(two, "b\n"), (two, "c\n"), (one, "d\n")])

    def is_done() -> bool:
        step = next(writes, None)
        if step:
            with open(step[0], "a") as handle:
                handle.write(step[1])
        return step is None

    job_logs.follow(
        lambda: [p for p in (one, two) if p.exists()], is_done, poll=0, header=lambda p: f"== {p.name}"
    )
    assert capsys.readouterr().out == "a\n== log-r_1_1.out\nb\nc\n== log-r_1_0.out\nd\n"


def test_follow_of_one_log_prints_it_as_it_is(run, capsys):
    """Its .err, which stderr_to_stdout (the default) never writes, is no second log: no header."""
    assert logs(capsys, run, "--launch", "2", "-f") == (0, "v2\n", "")
    latest = labelled(run, ("validation", "300", "v3\n"), ("training", "301", "t3\n"))
    assert logs(capsys, run, "-f") == (0, latest, "")


def test_follow_goes_on_while_slurm_does_not_answer(tmp_path, capsys, monkeypatch):
    """`gptrain logs -f` of a running job stopped at squeue's first timeout: a job Slurm did not
    answer about was taken for one that could not run, so it exited 0 at once, silently, and
    missed what the job wrote after. It keeps following until Slurm says the job ended."""
    import shutil
    import subprocess

    log = tmp_path / "log-r_7.out"
    log.write_text("iteration 1\n")
    append_record(tmp_path, "submitted", stage="training", executor="slurm", job_id="7",
                  log=str(tmp_path / "log-r_%j.out"), dependency=None)  # fmt: skip
    down = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
    controller = {"up": False, "sleeps since": 0}

    def run_command(command, timeout=15.0):
        if not controller["up"]:
            return subprocess.CompletedProcess(command, 1, "", down)
        if command[0] == "squeue":  # past the job's end: squeue lists it no more
            return subprocess.CompletedProcess(command, 0, "", "")
        return subprocess.CompletedProcess(command, 0, "JobId=7 JobState=COMPLETED ExitCode=0:0\n", "")

    def sleep(seconds: float) -> None:  # the job goes on writing; then Slurm answers again
        if controller["up"]:  # Slurm is asked again within a read or two (it was silent once)
            controller["sleeps since"] += 1
            assert controller["sleeps since"] < 2, "still following a job Slurm says has ended"
            return
        with open(log, "a") as handle:
            handle.write("iteration 2\ngptrain: step finished with exit code 0\n")
        controller["up"] = True

    monkeypatch.setattr(
        shutil, "which", lambda name: f"/usr/bin/{name}"
    )  # Slurm is here: squeue failing is its silence
    monkeypatch.setattr(slurm_queries, "run_command", run_command)
    monkeypatch.setattr(job_logs.time, "sleep", sleep)
    assert logs(capsys, tmp_path, "-f") == (
        0,
        "iteration 1\niteration 2\ngptrain: step finished with exit code 0\n",
        f"{job_logs.SLURM_SILENT}\n{job_logs.SLURM_BACK}\n",
    )


def test_follow_asks_a_silent_slurm_less_often_and_says_so_once(tmp_path, capsys, monkeypatch):
    """While Slurm did not answer, `gptrain logs -f` asked squeue, scontrol and sacct every 0.5 s for
    ever and said nothing. It asks after twice as many quiet reads each time (up to 60: 30 s), reads
    the log every 0.5 s all along, and says once on stderr that Slurm went silent and once that it
    answers again."""
    log = tmp_path / "log.out"
    log.write_text("")
    answers = [None] * 10 + [False, False, None, None, True]
    sleeps, gaps, written = [], [], []

    def is_done() -> bool | None:
        gaps.append(len(sleeps) - sum(gaps))
        return answers[len(gaps) - 1]

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) % 10 == 0:  # the job goes on writing while Slurm is silent
            written.append(f"line {len(sleeps)}\n")
            with open(log, "a") as handle:
                handle.write(written[-1])

    monkeypatch.setattr(job_logs.time, "sleep", sleep)
    job_logs.follow(lambda: [log], is_done)
    assert gaps == [0, 2, 4, 8, 16, 32, 60, 60, 60, 60, 60, 1, 1, 2, 4]
    assert set(sleeps) == {0.5}
    out, err = capsys.readouterr()
    assert out == "".join(written)
    assert err == f"{job_logs.SLURM_SILENT}\n{job_logs.SLURM_BACK}\n" * 2


SLURM_DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


def slurm_down(monkeypatch: pytest.MonkeyPatch, sleep: Callable[[float], None]) -> list[str]:
    """Slurm installed here and its controller down for good; the commands asked of it."""
    import shutil
    import subprocess

    asked = []

    def run_command(command, timeout=15.0):
        asked.append(command[0])
        return subprocess.CompletedProcess(command, 1, "", SLURM_DOWN)

    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(slurm_queries, "run_command", run_command)
    monkeypatch.setattr(job_logs.time, "sleep", sleep)
    return asked


def never_more_than(polls: int) -> Callable[[float], None]:
    sleeps = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        assert len(sleeps) < polls, "still following a job whose log says it ended"

    return sleep


@pytest.mark.parametrize(
    ("files", "array"),
    [
        ({"log-r_7.out": "iteration 9\ngptrain: step finished with exit code 0\n"}, None),
        ({"log-r_7.out": "iteration 9\n", "log-r_7.err": "gptrain: step finished with exit code 1\n"}, None),
        ({"log-r_7_0.out": "gptrain: step finished with exit code 0\n",
          "log-r_7_1.out": "gptrain: step finished with exit code 3\n"}, 2),
    ],
)  # fmt: skip
def test_follow_stops_at_the_exit_line_while_slurm_does_not_answer(
    tmp_path, capsys, monkeypatch, files, array
):
    """`gptrain logs -f` went on following for ever while the controller was down, though the log
    already ended with the batch script's exit line, the last thing a job writes (its .err with
    cluster.stderr_to_stdout=false; an array: every task's). It asks Slurm once more, then stops."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    pattern = "log-r_%A_%a.out" if array else "log-r_%j.out"
    append_record(tmp_path, "submitted", stage="training", executor="slurm", job_id="7",
                  log=str(tmp_path / pattern), dependency=None, **({"array": array} if array else {}))  # fmt: skip
    asked = slurm_down(monkeypatch, never_more_than(20))
    code, out, err = logs(capsys, tmp_path, "-f")
    assert (code, err) == (0, f"{job_logs.SLURM_SILENT}\n{job_logs.LOG_ENDED}\n")
    assert all(text in out for text in files.values())
    # when it went silent, once more when the log had ended, and the check for a job that never starts
    assert asked.count("squeue") == 3


def test_follow_goes_on_past_the_exit_line_of_a_job_slurm_requeued(tmp_path, capsys, monkeypatch):
    """A preempted job's batch script writes its exit line after saying Slurm requeued it: the job
    runs again, appending to the same log, so following goes on to the next attempt's exit line."""
    log = tmp_path / "log-r_7.out"
    log.write_text(
        "gptrain: job 7 on n1, stage training\niteration 9\n"
        "gptrain: Slurm requeued the job itself (preemption): it resumes when it starts again\n"
        "gptrain: step finished with exit code 75\n"
    )
    append_record(tmp_path, "submitted", stage="training", executor="slurm", job_id="7",
                  log=str(tmp_path / "log-r_%j.out"), dependency=None)  # fmt: skip
    again = "gptrain: job 7 on n2, stage training\niteration 10\ngptrain: step finished with exit code 0\n"
    sleeps = []

    def sleep(seconds: float) -> None:  # the next attempt starts a few reads later
        sleeps.append(seconds)
        assert len(sleeps) < 40, "still following a job whose log says it ended"
        if len(sleeps) == 5:
            with open(log, "a") as handle:
                handle.write(again)

    slurm_down(monkeypatch, sleep)
    code, out, err = logs(capsys, tmp_path, "-f")
    assert (code, err) == (0, f"{job_logs.SLURM_SILENT}\n{job_logs.LOG_ENDED}\n")
    assert out.endswith(again)
