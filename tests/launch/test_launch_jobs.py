import json
import os
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from gptrain.config import load_training_config
from gptrain.errors import ConfigError, LaunchError
from gptrain.launch import cancelling, job_states, live_jobs, record_state, run_dirs, slurm_queries, status
from gptrain.launch.gres import gres_gpus
from gptrain.launch.preflight import Node, check_cluster, check_training_files, query_nodes
from gptrain.launch.records import append_record, read_records
from gptrain.launch.sbatch import Job

LINE = (
    " [2026-11-21 23:40:01.123456] iteration      120/    1000 | consumed samples:        30720 |"
    " elapsed time per iteration (ms): 812.0 | throughput per GPU (TFLOP/s/GPU): 101.2 |"
    " learning rate: 5.999000E-04 | global batch size:   256 | lm loss: 3.210987E+00 | loss scale: 1.0 |"
    " grad norm: 0.812 | number of skipped iterations:   0 | number of nan iterations:   0 |"
)


def test_progress_from_the_last_megatron_line(tmp_path):
    log = tmp_path / "log.out"
    log.write_text(
        "noise\n" + LINE.replace("120/", "119/") + "\n" + LINE + "\nvalidation loss at iteration 120\n"
    )
    # ETA = (1000 - 120) steps * 0.812 s = 714.56 s = 11:54
    assert status.progress(log) == "step 120/1000 | loss 3.2110 | 812 ms/step | ETA 11:54"
    log.write_text("no iterations yet\n")
    assert status.progress(log) is None
    # the job's first line is its first step alone (compilation included): no ETA from it yet
    log.write_text(LINE.replace("(ms): 812.0", "(ms): 25000.0") + "\n")
    assert status.progress(log) == "step 120/1000 | loss 3.2110 | 25000 ms/step"


def test_a_requeued_jobs_first_line_gives_no_eta_and_an_ended_job_none(tmp_path):
    """Slurm appends a requeued job's output to the same log: the restarted process's first line
    (its compilation) must not set the ETA; nor does a job that has ended have one."""
    log = tmp_path / "log.out"
    banner = "gptrain: 124,082,688 parameters | 6.306e+12 FLOPs per iteration | 1 microbatches per step\n"
    first = LINE.replace("120/", "121/").replace("(ms): 812.0", "(ms): 25000.0")
    log.write_text(banner + LINE.replace("120/", "119/") + "\n" + LINE + "\n" + banner + first + "\n")
    assert status.progress(log) == "step 121/1000 | loss 3.2110 | 25000 ms/step"
    log.write_text(banner + LINE.replace("120/", "119/") + "\n" + LINE + "\n")
    assert status.progress(log).endswith("| ETA 11:54")
    assert status.progress(log, running=False) == "step 120/1000 | loss 3.2110 | 812 ms/step"
    # the restarted process has printed its banner and no step yet: the line before is the earlier process's
    log.write_text(banner + LINE.replace("120/", "119/") + "\n" + LINE + "\n" + banner)
    assert status.progress(log) == "step 120/1000 | loss 3.2110 | 812 ms/step"


@pytest.mark.parametrize("label", ["0: ", " 0: ", "12: "])
def test_a_requeue_is_seen_in_a_log_that_srun_labels(tmp_path, label):
    """With `srun --label` in cluster.srun_args (the Megatron tutorial's srun -l) every line starts
    with its task id: the restarted process's banner went unseen, and its compilation step gave the ETA."""
    log = tmp_path / "log.out"
    banner = "gptrain: 124,082,688 parameters | 6.306e+12 FLOPs per iteration | 1 microbatches per step"
    first = LINE.replace("120/", "121/").replace("(ms): 812.0", "(ms): 25000.0")
    lines = [banner, LINE.replace("120/", "119/"), LINE, banner, first]
    log.write_text("".join(f"{label}{line}\n" for line in lines))
    assert status.progress(log) == "step 121/1000 | loss 3.2110 | 25000 ms/step"


@pytest.mark.parametrize(
    ("code", "described"),
    [
        (0, "COMPLETED"),
        (75, "INTERRUPTED (checkpoint saved; launch the same command again to resume)"),
        (76, "HUNG (a rank hung, see the log; launch again to resume from the last checkpoint)"),
        (130, "CANCELLED (stopped by Ctrl-C; launch again to resume from the last checkpoint)"),
        (2, "FAILED exit 2"),
    ],
)
def test_a_local_job_stopped_with_a_checkpoint_is_not_called_failed(code, described):
    record = {"event": "submitted", "executor": "local", "job_id": "local-1", "pid": 0}
    state = record_state.job_state(
        record, [record, {"event": "finished", "job_id": "local-1", "exit_code": code}]
    )
    assert state.describe() == described and not state.active


# gptrain.train.loop's lines for a stop during start-up (fresh, and resumed from iteration 2) and a saved stop
EARLY_FRESH = (
    "stopping before the first step: received SIGTERM; nothing trained since no checkpoint, nothing saved;"
    " exit 75 to be requeued"
)
EARLY_RESUMED = EARLY_FRESH.replace("no checkpoint", "iteration 2's checkpoint").replace("SIGTERM", "SIGUSR1")
SAVED = "stopping at iteration 5: received SIGUSR1; exit 75 to be requeued"


@pytest.mark.parametrize(
    ("log", "described"),
    [
        (
            [EARLY_FRESH],
            "INTERRUPTED (received SIGTERM during start-up: stopped before step 1, no checkpoint exists;"
            " launch the same command again to start it afresh)",
        ),
        (
            [LINE, SAVED, EARLY_RESUMED],
            "INTERRUPTED (received SIGUSR1 during start-up: nothing trained or saved since iteration 2's"
            " checkpoint; launch the same command again to resume from iteration 2)",
        ),
        (
            [EARLY_FRESH, LINE, SAVED],
            "INTERRUPTED (checkpoint saved; launch the same command again to resume)",
        ),
    ],
)
def test_a_stop_during_start_up_is_not_called_a_saved_checkpoint(tmp_path, log, described):
    """A stop signal before step 1 of a fresh run exits 75 with nothing saved: status said
    'checkpoint saved; launch again to resume' of a run that has no checkpoint. The log's last stop
    line decides (a requeue or relaunch appends to the same log)."""
    (tmp_path / "log.out").write_text("\n".join(log) + "\n")
    record = {"event": "submitted", "stage": "training", "executor": "local", "job_id": "local-1", "pid": 0}
    record["log"] = str(tmp_path / "log.out")
    state = record_state.job_state(
        record, [record, {"event": "finished", "job_id": "local-1", "exit_code": 75}]
    )
    assert state.describe() == described


def test_a_slurm_job_stopped_during_start_up_and_not_requeued_says_it_has_no_checkpoint(
    tmp_path, monkeypatch
):
    log = tmp_path / "log-r_7.out"
    log.write_text(f"gptrain: job 7 on n1, stage training\n{EARLY_FRESH}\n")
    append_record(tmp_path, "submitted", stage="training", executor="slurm", job_id="7",
                  log=str(tmp_path / "log-r_%j.out"), dependency=None)  # fmt: skip
    scontrol = "JobId=7 JobName=r\n   JobState=FAILED Reason=NonZeroExitCode ExitCode=75:0\n"
    monkeypatch.setattr(slurm_queries, "run_command", lambda command, timeout=15.0: subprocess.CompletedProcess(
        command, 0, scontrol if command[0] == "scontrol" else "", ""))  # fmt: skip
    assert status.status_lines(tmp_path) == [
        f"{tmp_path.name}  training  job 7  FAILED (received SIGTERM during start-up: stopped before step 1,"
        " no checkpoint exists; not requeued: max_requeues reached or the requeue failed; launch again to"
        " start it afresh) exit 75:0"
    ]


# gptrain.train.stopping.exit_at_interval's line: exit 0 at trainer.exit_interval, before max_steps
AT_INTERVAL = "exiting at iteration 120: trainer.exit_interval=120; the same command resumes from its checkpoint; exit 0"
CONTINUES = "stopped at its exit interval at iteration 120, not finished; launch the same command again to continue from its checkpoint"
# gptrain.train.builders.log_memory's report, which a GPU run prints after the exit line
MEMORY = "[Rank 0] (after 120 iterations) memory (MB) | allocated: 1.0 | max allocated: 2.0 | reserved: 3.0 | max reserved: 4.0"
BANNER = "gptrain: 124,082,688 parameters | 6.306e+12 FLOPs per iteration | 1 microbatches per step"


@pytest.mark.parametrize(
    ("tail", "said"),
    [
        ([AT_INTERVAL], f" ({CONTINUES})"),
        ([AT_INTERVAL.replace("; the same command resumes from its checkpoint", " (checkpoints are off)")],
         " (stopped at its exit interval at iteration 120, not finished; launch the same command again to"
         " start afresh (checkpoints are off))"),
        ([AT_INTERVAL, LINE.replace("120/", "121/")], ""),  # an exit line of an attempt before the last
        ([AT_INTERVAL, MEMORY], f" ({CONTINUES})"),  # on a GPU
        ([AT_INTERVAL, MEMORY, BANNER, MEMORY], ""),  # a later attempt that trained no step
        ([], ""),  # ran to max_steps
    ],
)  # fmt: skip
def test_a_local_run_that_exited_at_its_exit_interval_is_not_called_finished(tmp_path, tail, said):
    """trainer.exit_interval exits 0 before max_steps, as Megatron's --exit-interval: status called
    the run a bare COMPLETED, as if it had trained to the end."""
    (tmp_path / "log.out").write_text(
        "\n".join([LINE, *tail, "gptrain: step finished with exit code 0"]) + "\n"
    )
    record = {"event": "submitted", "stage": "training", "executor": "local", "job_id": "local-1", "pid": 0}
    record["log"] = str(tmp_path / "log.out")
    state = record_state.job_state(
        record, [record, {"event": "finished", "job_id": "local-1", "exit_code": 0}]
    )
    assert state.describe() == f"COMPLETED{said}"


@pytest.mark.parametrize(
    ("scontrol", "said"),
    [
        ("JobId=7 JobName=r\n   JobState=COMPLETED Reason=None ExitCode=0:0\n", CONTINUES),
        ("", f"Slurm no longer knows the job; from its log; {CONTINUES}"),
    ],
)
def test_a_slurm_job_that_exited_at_its_exit_interval_is_not_called_finished(
    tmp_path, monkeypatch, scontrol, said
):
    log = tmp_path / "log-r_7.out"
    log.write_text(
        f"gptrain: job 7 on n1, stage training\n{LINE}\n{AT_INTERVAL}\ngptrain: step finished with exit code 0\n"
    )
    append_record(tmp_path, "submitted", stage="training", executor="slurm", job_id="7",
                  log=str(tmp_path / "log-r_%j.out"), dependency=None)  # fmt: skip
    monkeypatch.setattr(slurm_queries, "run_command", lambda command, timeout=15.0: subprocess.CompletedProcess(
        command, 0, scontrol if command[0] == "scontrol" else "", ""))  # fmt: skip
    line = status.status_lines(tmp_path)[0]
    assert line.startswith(f"{tmp_path.name}  training  job 7  COMPLETED ({said})  | step 120/1000")


def test_parse_scontrol_and_gres():
    text = "JobId=5 JobName=a b\n   JobState=PENDING Reason=DependencyNeverSatisfied Dependency=afterok:4(failed)\n"
    [record] = slurm_queries.parse_scontrol(text)
    assert record["JobState"] == "PENDING" and record["Reason"] == "DependencyNeverSatisfied"
    assert [gres_gpus(g) or 0 for g in ("gpu:8", "gpu:a100:4(S:0-1)", "gpu:2,shard:8", "(null)", None)] == [
        8,
        4,
        2,
        0,
        0,
    ]


def nodes(cpus=2, gpus=0, count=2, state="idle"):
    return [Node(f"n{i}", "debug", True, cpus, gpus, state) for i in range(count)]


def test_preflight_catches_requests_slurm_would_queue_forever():
    job = Job("training", "r", "r", None, [], nodes=2, tasks_per_node=2)
    assert (
        check_cluster(job, {}, nodes()).startswith("ok  training: partition debug, 2/2 nodes, 4/2") is False
    )
    assert "2/2 nodes, 2/2 CPUs, 0/0 GPUs" in check_cluster(job, {}, nodes())
    with pytest.raises(LaunchError, match="does not exist.*did you mean 'debug'"):
        check_cluster(job, {"partition": "debg"}, nodes())
    with pytest.raises(LaunchError, match="3 node"):
        check_cluster(Job("training", "r", "r", None, [], nodes=3), {}, nodes())
    with pytest.raises(LaunchError, match="1 usable"):
        check_cluster(job, {}, nodes()[:1] + nodes(state="drained")[1:])
    # sbatch --exclude / --nodelist narrow what the job may use (a failed validation's exclude file too)
    with pytest.raises(LaunchError, match=r"1 usable \(after cluster.exclude / cluster.nodelist\)"):
        check_cluster(job, {"exclude": "n1"}, nodes())
    three = Job("training", "r", "r", None, [], nodes=3)
    with pytest.raises(LaunchError, match="3 node.*2 usable"):
        check_cluster(three, {"exclude": "n[0-1,4]", "nodelist": "n[0-4]"}, nodes(count=5))
    assert "2/2 nodes" in check_cluster(job, {"nodelist": ["n3", "n4"]}, nodes(count=5))
    with pytest.raises(LaunchError, match="cluster.exclude: cannot parse host list item"):
        check_cluster(job, {"exclude": "n[1-"}, nodes())
    with pytest.raises(LaunchError, match="4 CPUs per node requested"):
        check_cluster(Job("t", "r", "r", None, [], tasks_per_node=4), {}, nodes())
    gpu_job = Job("training", "r", "r", None, [], tasks_per_node=1, gpus=True)
    with pytest.raises(LaunchError, match="8 GPUs per node requested but nodes of 'debug' have 4"):
        check_cluster(gpu_job, {"gres": "gpu:8"}, nodes(gpus=4))


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("gpu", 1),
        ("gpu:a100", 1),
        ("gpu,shard:8", 1),
        ("gpu:a100:4(S:0,2)", 4),
        ("gpu:0", 0),
        ("gpumem:8G", 0),
    ],
)
def test_a_gpu_gres_without_a_count_is_one_gpu(gres, gpus):
    """Slurm reads `--gres=gpu` and `gpu:a100` as one GPU: they were read as none, so the partition
    check fitted them on CPU nodes and the launch said the job asks Slurm for no GPU."""
    assert (gres_gpus(gres) or 0) == gpus


def test_a_gpu_gres_without_a_count_is_checked_against_the_partition_and_not_said_to_ask_none(tmp_path):
    from gptrain.launch.compose import compose
    from gptrain.launch.launcher import no_gpus_asked_notes
    from gptrain.launch.stages import build_plan

    gpu_job = Job("training", "r", "r", None, [], tasks_per_node=1, gpus=True)
    with pytest.raises(LaunchError, match="1 GPUs per node requested but nodes of 'debug' have 0"):
        check_cluster(gpu_job, {"gres": "gpu:a100"}, nodes())
    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", "cluster.gpus_per_node=null"]
    plan = build_plan(compose([*args, "cluster.gres=gpu", "training.trainer.devices=1"]))
    assert no_gpus_asked_notes(plan) == []


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("gpu:8", 8), ("gpu:h100:8", 8), ("gres/gpu=8", 8), ("gres/gpu:8", 8), ("gres/gpu:h100:8", 8),
        ("gpu=8", 8), ("gpu", 1), ("gpu:h100", 1), ("gpu:3g.20gb:2", 2), ("gpu:h100:8(S:0-1)", 8),
        ("gpu:a100:4(S:0,2)", 4), ("gpu:8(IDX:0-7)", 8), ("gpu:2,shard:8", 2), ("shard:8,gpu:4", 4),
        ("gpu:a100:4,gpu:v100:2", 6), ("gpu:0", 0), ("gpumem:8G", None), ("(null)", None), ("", None),
        (None, None),
    ],
)  # fmt: skip
def test_one_gres_reader_for_every_form_slurm_takes(gres, gpus):
    """preflight's parse_gpus and sbatch_directives' gres_gpus read the same strings two ways (the
    first counted every gpu entry, the second the first alone) and neither read the TRES form
    sbatch's --gres also takes (`gres/gpu:8`, `gres/gpu=8`): one reader now, as Slurm reads them."""
    from gptrain.launch.gres import gres_gpus

    assert gres_gpus(gres) == gpus


def test_every_check_reads_a_tres_form_gres_as_its_gpus(tmp_path):
    """`cluster.gres=gres/gpu:4` asks Slurm for 4 GPUs, but was read as none: 8 ranks per node on it
    passed the one-task-per-GPU check, and the partition check fitted them on CPU nodes. Two GPU
    types on a node were 4 GPUs to the #SBATCH lines (the first type) against gpus_per_node=8."""
    from gptrain.launch.compose import compose
    from gptrain.launch.sbatch_directives import gpu_directives
    from gptrain.launch.stages import build_plan

    args = ["cluster_type=slurm", f"base_results_dir={tmp_path}", "cluster.gpus_per_node=null"]
    with pytest.raises(ConfigError, match="cluster.gres gives 4 GPUs per node"):
        build_plan(compose([*args, "cluster.gres=gres/gpu:4", "training.trainer.devices=8"]))
    gpu_job = Job("training", "r", "r", None, [], tasks_per_node=1, gpus=True)
    with pytest.raises(LaunchError, match="4 GPUs per node requested but nodes of 'debug' have 0"):
        check_cluster(gpu_job, {"gres": "gres/gpu=4"}, nodes())
    cluster = {"gres": "gpu:a100:4,gpu:v100:4", "gpus_per_node": 8}
    assert gpu_directives(gpu_job, cluster) == ["#SBATCH --gres=gpu:a100:4,gpu:v100:4"]


@pytest.mark.parametrize(
    "cluster",
    [
        {"overcommit": True},
        {"additional_parameters": {"overcommit": True}},
        {"additional_parameters": {"overc": True}},
    ],
)
def test_an_overcommitted_job_asks_for_its_cpus_per_task_per_node(cluster):
    """With --overcommit Slurm allocates as if one task ran per node (sbatch(1): the CPUs per task
    are allocated per node, not multiplied by the tasks): 8 tasks on 2-CPU nodes were refused as
    16 CPUs per node, which Slurm would have run."""
    job = Job("training", "r", "r", None, [], nodes=2, tasks_per_node=8, cpus_per_task=2)
    assert check_cluster(job, cluster, nodes()).startswith(
        "ok  training: partition debug, 2/2 nodes, 2/2 CPUs"
    )
    with pytest.raises(LaunchError, match="16 CPUs per node requested"):
        check_cluster(job, {"overcommit": False}, nodes())


def test_a_list_of_partitions_fits_when_one_of_them_does():
    """sbatch -p a,b starts the job in whichever partition can run it first."""
    cluster = [*nodes(count=1), *[Node(f"g{i}", "big", False, 8, 0, "idle") for i in range(4)]]
    job = Job("training", "r", "r", None, [], nodes=3, tasks_per_node=2)
    assert check_cluster(job, {"partition": "debug,big"}, cluster).startswith(
        "ok  training: partition big, 3/4"
    )
    with pytest.raises(LaunchError, match="partition 'bgi' does not exist"):
        check_cluster(job, {"partition": "debug,bgi"}, cluster)
    with pytest.raises(
        LaunchError, match=r"partition 'debug' has 1 usable.*; .*partition 'big' has 4 usable"
    ):
        check_cluster(Job("training", "r", "r", None, [], nodes=5), {"partition": "debug, big"}, cluster)


def test_preflight_data_files(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"")

    def training(*overrides):
        return load_training_config("gpt3/126m", overrides=overrides, report_ignored=False)

    (tmp_path / "merges.txt").write_text("#version: 0.2\n")  # the job refuses a GPT-2 run without it
    vocab = [
        f"model.tokenizer.vocab_file={tmp_path}/vocab.json",
        f"model.tokenizer.merge_file={tmp_path}/merges.txt",
    ]
    blend = [f"model.data.data_prefix=[1.0,{tmp_path}/a]", *vocab]
    with pytest.raises(LaunchError, match="a.idx not found"):
        check_training_files(training(*blend), prepared_by_stage=False)
    (tmp_path / "a.idx").write_bytes(b"")
    with pytest.raises(LaunchError, match="tokenizer.vocab_file"):
        check_training_files(training(*blend), prepared_by_stage=False)
    (tmp_path / "vocab.json").write_text("{}")
    assert check_training_files(training(*blend), prepared_by_stage=False) == [
        "ok  training: 1 data prefix(es) found",
        "ok  training.model.tokenizer: vocab_file, merge_file present",
    ]
    # NeMo's per-split form: every split's prefixes are checked
    per_split = f"model.data.data_prefix={{train: {tmp_path}/a, validation: {tmp_path}/v}}"
    with pytest.raises(LaunchError, match=r"data_prefix: .*/v\.bin/\.idx not found"):
        check_training_files(training(per_split, *vocab), prepared_by_stage=False)


def test_preflight_takes_a_prefix_given_with_bin_as_the_job_does(tmp_path):
    """The job reads `x_text_document.bin` as the prefix `x_text_document` (IndexedDataset); the launch
    preflight looked for `x_text_document.bin.bin` and stopped a launch the job would have run."""
    for suffix in (".bin", ".idx"):
        (tmp_path / f"a_text_document{suffix}").write_bytes(b"")
    for given in ("a_text_document.bin", "a_text_document.idx"):
        cfg = load_training_config(
            "gpt3/126m",
            overrides=[f"model.data.data_prefix=[1.0,{tmp_path}/{given}]", "model.tokenizer.vocab_file=null",
                       "model.tokenizer.merge_file=null", "model.tokenizer.library=tiktoken",
                       "model.tokenizer.model=gpt2"],
            report_ignored=False,
        )  # fmt: skip
        lines = check_training_files(cfg, prepared_by_stage=False)
        assert lines[0] == "ok  training: 1 data prefix(es) found"


def test_preflight_names_the_text_document_prefix_meant(tmp_path):
    """The Megatron tutorial preprocesses with --output-prefix /fsx/my-gpt2, which writes
    my-gpt2_text_document.bin/.idx; a data_prefix of my-gpt2 now says so instead of "prepare the data"."""
    for suffix in (".bin", ".idx"):
        (tmp_path / f"my-gpt2_text_document{suffix}").write_bytes(b"")
    cfg = load_training_config(
        "gpt3/126m", overrides=[f"model.data.data_prefix=[1.0,{tmp_path}/my-gpt2]"], report_ignored=False
    )
    with pytest.raises(LaunchError) as error:
        check_training_files(cfg, prepared_by_stage=False)
    assert str(error.value) == (
        f"training.model.data.data_prefix: {tmp_path}/my-gpt2.bin/.idx not found; did you mean"
        f" {tmp_path}/my-gpt2_text_document? (preprocess_data.py and gptrain data prepare name their"
        " output <--output-prefix>_text_document)"
    )


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        (
            "[-1.0,{d}/a]",
            r"^training\.model\.data\.data_prefix: data prefix entry 1: weight -1\.0 .* must be positive$",
        ),
        (
            "[1,{d}/a,0.0,{d}/a]",
            r"^training\.model\.data\.data_prefix: data prefix entry 3: weight 0\.0 .* must be positive: Megatron-core",
        ),
        (
            "[1,{d}/a,nan,{d}/a]",
            r"^training\.model\.data\.data_prefix: data prefix entry 3: weight nan of .* must be positive$",
        ),
        ("[1.0,{d}/a,2.0]", r"^training\.model\.data\.data_prefix: data prefix list .* unweighted form"),
        ("[{d}/a,{d}/a]", r"^training\.model\.data\.data_prefix: data prefix list .* unweighted form"),
        (
            "{{train: [0,{d}/a,1,{d}/a]}}",
            r"^training\.model\.data\.data_prefix\.train: data prefix entry 1: .* Megatron-core",
        ),
        (
            "{{train: [-1,{d}/a]}}",
            r"^training\.model\.data\.data_prefix\.train: data prefix entry 1: .* must be 0 or more",
        ),
        (
            "{{train: {d}/a, validation: [1,{d}/a,-1,{d}/a]}}",
            r"^training\.model\.data\.data_prefix\.validation: data prefix entry 3",
        ),
    ],
)
def test_preflight_refuses_a_blend_the_job_would_refuse(tmp_path, prefix, message):
    """Before the queue wait, not when the job starts: the same reading of the blend as the job's."""
    for suffix in (".bin", ".idx"):
        (tmp_path / f"a{suffix}").write_bytes(b"")
    cfg = load_training_config(
        "gpt3/126m", overrides=[f"model.data.data_prefix={prefix.format(d=tmp_path)}"], report_ignored=False
    )
    with pytest.raises(ConfigError, match=message):
        check_training_files(cfg, prepared_by_stage=False)


@pytest.mark.parametrize(("limit", "refused"), [(0, False), (2, True)])
def test_preflight_looks_up_only_the_files_of_splits_the_job_builds(tmp_path, limit, refused):
    """The job builds no split asked for 0 samples (trainer.limit_test_batches=0) and so never opens its
    files; preflight looks up the same files the job's own check at start does."""
    for suffix in (".bin", ".idx"):
        (tmp_path / f"a{suffix}").write_bytes(b"")
    prefix = f"model.data.data_prefix={{train: {tmp_path}/a, test: {tmp_path}/gone}}"
    tokenizer = ["model.tokenizer.vocab_file=null", "model.tokenizer.merge_file=null",
                 "model.tokenizer.library=tiktoken", "model.tokenizer.model=gpt2"]  # fmt: skip
    given = [prefix, f"trainer.limit_test_batches={limit}", *tokenizer]
    cfg = load_training_config("gpt3/126m", overrides=given, report_ignored=False)
    if refused:
        with pytest.raises(
            LaunchError, match=r"^training\.model\.data\.data_prefix: .*/gone\.bin/\.idx not found"
        ):
            check_training_files(cfg, prepared_by_stage=False)
    else:
        assert (
            check_training_files(cfg, prepared_by_stage=False)[0] == "ok  training: 1 data prefix(es) found"
        )


def test_preflight_takes_a_splits_lone_prefix_whatever_its_weight(tmp_path):
    """Megatron builds a split's blend of one prefix as that dataset, its weight unused (`--valid-data-path
    0 V`); preflight refused the 0 as weights summing to 0, and a 0 in a blend of two is still refused."""
    for suffix in (".bin", ".idx"):
        (tmp_path / f"a{suffix}").write_bytes(b"")
    lone = f"model.data.data_prefix={{train: {tmp_path}/a, validation: [0,{tmp_path}/a]}}"
    tokenizer = ["model.tokenizer.vocab_file=null", "model.tokenizer.merge_file=null",
                 "model.tokenizer.library=tiktoken", "model.tokenizer.model=gpt2"]  # fmt: skip
    cfg = load_training_config("gpt3/126m", overrides=[lone, *tokenizer], report_ignored=False)
    assert check_training_files(cfg, prepared_by_stage=False)[0] == "ok  training: 2 data prefix(es) found"


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        ("[-0.7,{d}/my-gpt3_00,0.3,{d}/my-gpt3_01]", r"^training\.model\.data\.data_prefix: data prefix entry 1: weight -0\.7"),
        ("[0,{d}/my-gpt3_00,1,{d}/my-gpt3_01]", r"^training\.model\.data\.data_prefix: .* must be positive: Megatron-core"),
    ],
)  # fmt: skip
def test_preflight_refuses_a_bad_blend_of_shards_data_preparation_writes(tmp_path, prefix, message):
    """With stages=[data_preparation,training] a data_prefix naming the prepared shards is read as written,
    weights and all; the files are not there yet, but the weights are: a negative or 0 one was
    left to the training job, after the data preparation had run (hours) and the job waited in the queue."""
    tokenizer = ["model.tokenizer.vocab_file=null", "model.tokenizer.merge_file=null",
                 "model.tokenizer.library=tiktoken", "model.tokenizer.model=gpt2"]  # fmt: skip
    cfg = load_training_config(
        "gpt3/126m", [f"model.data.data_prefix={prefix.format(d=tmp_path)}", *tokenizer], report_ignored=False
    )
    with pytest.raises(ConfigError, match=message):
        check_training_files(cfg, prepared_by_stage=True)
    good = load_training_config(
        "gpt3/126m", ["model.data.data_prefix=[0.7,a,0.3,b]", *tokenizer], report_ignored=False
    )
    assert check_training_files(good, prepared_by_stage=True) == [
        "ok  training.model.tokenizer: no files present"
    ]


@pytest.mark.parametrize(
    ("prefix", "refused"),
    [
        ("[0,/old/x,1,/old/y]", False),  # replaced by the blend data_preparation writes: never read
        ("[0,${data_dir}/tokenized/a_text_document]", True),  # the prepared shard: read as written, weights and all
    ],
)  # fmt: skip
def test_preflight_reads_the_weights_of_the_data_prefix_the_job_reads(
    tmp_path, monkeypatch, capsys, prefix, refused
):
    """With stages=[data_preparation,training] a data_prefix naming other prefixes than the prepared shards
    is replaced by the blend data preparation writes; preflight still refused its weights (283d507), so a
    launch was stopped by a data_prefix its job would never read."""
    from gptrain.cli import main

    monkeypatch.chdir(tmp_path)
    args = [
        "launch",
        "--dry-run",
        "cluster_type=local",
        f"data_dir={tmp_path}/d",
        "stages=[data_preparation,training]",
    ]
    args += ["data_preparation.shards=[https://h/a.jsonl.zst]", f"training.model.data.data_prefix={prefix}"]
    args += ["training.trainer.accelerator=cpu", "training.trainer.devices=1", "training.trainer.num_nodes=1"]
    assert main(args) == (2 if refused else 0)
    err = capsys.readouterr().err
    assert ("training.model.data.data_prefix: data prefix entry 1: weight 0 of" in err) is refused
    if not refused:
        assert "note  training: reads the blend data_preparation writes" in err


@pytest.mark.parametrize("command", ["cancel", "status", "logs"])
def test_a_results_dir_given_as_the_run_is_refused_listing_its_runs(tmp_path, monkeypatch, capsys, command):
    """`gptrain cancel results` (a base_results_dir, not a run) cancelled whichever run was launched
    last, at any depth, as if it had been named; status and logs showed that one run alone. Only a
    unique_output run's `<name>/<time>/` is gone down into."""
    from gptrain.cli import main

    results = tmp_path / "results"
    for name in ("victim", "f1", "gpt3/20261129-041536"):
        (results / name).mkdir(parents=True)
        (results / name / "log-r_7.out").write_text(LINE + "\n")
        append_record(results / name, "submitted", stage="training", executor="slurm", job_id="7",
                      log=str(results / name / "log-r_%j.out"), dependency=None)  # fmt: skip
    asked = []

    def run_command(command, timeout=15.0):
        asked.append(command[0])
        return subprocess.CompletedProcess(
            command, 0, "7|RUNNING|None\n" if command[0] == "squeue" else "", ""
        )

    monkeypatch.setattr(slurm_queries, "run_command", run_command)
    for given in (str(results), str(results / "gpt3" / "..")):
        assert main([command, given, "--results-dir", str(results)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and "scancel" not in asked
        assert err.startswith(
            f"gptrain: error: {given}: not a run; it holds 3 launched runs (f1, gpt3/20261129-041536, victim)"
        )
    # a unique_output run's name still finds its newest launch
    newer = results / "gpt3" / "20261129-051536"
    newer.mkdir()
    append_record(newer, "submitted", stage="training", executor="slurm", job_id="8", log=str(newer / "x"))
    assert run_dirs.find_run("gpt3", results) == newer
    shutil.rmtree(results / "victim"), shutil.rmtree(results / "f1")  # stamped runs, but a level down
    with pytest.raises(
        LaunchError, match=r"holds 2 launched runs \(gpt3/20261129-041536, gpt3/20261129-051536\)"
    ):
        run_dirs.find_run(str(results), results)


def test_a_run_name_over_one_nested_run_or_timestamped_launches_is_found(tmp_path, monkeypatch, capsys):
    """`gptrain status|logs <name>` went down only into launches named by gptrain's own stamp: a
    Hydra-style `<name>/2026-11-30_10-00-00/` and a single nested run (`solo/training`) were "not a
    run", and the run the error suggested was the oldest launch. The newest timestamped launch is
    found, a single nested run too for status and logs (cancel must be given the run itself), and the
    suggestion is the newest run."""
    from gptrain.cli import main

    results = tmp_path / "results"
    for age, name in enumerate(("gpt3/2026-11-30_10-00-00", "gpt3/2026-11-29_10-00-00", "solo/training")):
        (results / name).mkdir(parents=True)
        (results / name / "log-r_7.out").write_text(LINE + "\n")
        append_record(results / name, "submitted", stage="training", executor="slurm", job_id="7",
                      log=str(results / name / "log-r_%j.out"), dependency=None)  # fmt: skip
        os.utime(results / name / "launcher.log", (1e9 - age * 1000, 1e9 - age * 1000))  # first: newest
    monkeypatch.setattr(slurm_queries, "run_command", lambda command, timeout=15.0: subprocess.CompletedProcess(
        command, 0, "7|RUNNING|None\n" if command[0] == "squeue" else "", ""))  # fmt: skip
    assert run_dirs.find_run("gpt3", results) == results / "gpt3" / "2026-11-30_10-00-00"
    assert run_dirs.find_run("solo", results, one_nested=True) == results / "solo" / "training"
    assert main(["status", "solo", "--results-dir", str(results)]) == 0
    assert "training  job 7  RUNNING" in capsys.readouterr().out
    assert main(["logs", "solo", "--results-dir", str(results)]) == 0
    assert capsys.readouterr().out == LINE + "\n"
    assert main(["cancel", "solo", "--results-dir", str(results)]) == 2
    assert capsys.readouterr().err == (
        "gptrain: error: solo: not a run; it holds 1 launched run (training): name one (as"
        f" {results}/solo/training); for the state of them all: gptrain status --results-dir {results}/solo\n"
    )
    with pytest.raises(LaunchError, match=rf"name one \(as {results}/gpt3/2026-11-30_10-00-00\)"):
        run_dirs.find_run(str(results), results, one_nested=True)  # the newest of 3 runs


def test_local_run_status_and_find(tmp_path):
    run = tmp_path / "results" / "my_run"
    run.mkdir(parents=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        log = run / "log.out"
        log.write_text(LINE + "\n")
        append_record(
            run,
            "submitted",
            stage="training",
            executor="local",
            job_id="local-1",
            pid=sleeper.pid,
            log=str(log),
        )
        assert run_dirs.find_run("my_run", tmp_path / "results") == run
        [line] = status.status_lines(run)
        assert "training  job local-1  RUNNING" in line and "step 120/1000" in line
        assert cancelling.cancel(run) == ["cancelled training job local-1"]
        assert sleeper.wait(10) != 0
        append_record(run, "finished", job_id="local-1", exit_code=-15)
        assert "FAILED exit -15" in status.status_lines(run)[0]
    finally:
        sleeper.kill()
    assert read_records(run)[0]["pid"] == sleeper.pid
    assert "start_time" not in read_records(run)[0]  # a record of an older launch: the pid is trusted
    with pytest.raises(LaunchError, match="did you mean 'my_run'"):
        run_dirs.find_run("my_rn", tmp_path / "results")


def test_status_of_a_directory_that_no_launch_wrote_says_so(tmp_path, capsys):
    """A `gptrain train` run's directory, an empty one or a file: it said "no launched run 'DIR' in
    results; pass a run dir", to a user who had passed one."""
    from gptrain.cli import main

    trained = tmp_path / "trained"
    trained.mkdir()
    (trained / "nemo_log_globalrank-0_localrank-0.txt").write_text(LINE + "\n")
    (tmp_path / "notes.txt").write_text("x")
    base = ["--results-dir", str(tmp_path / "results")]
    assert main(["status", str(trained), *base]) == 2
    err = capsys.readouterr().err
    assert "no launcher.log here or below: not a run started by `gptrain launch`" in err
    assert f"its training log is {trained / 'nemo_log_globalrank-0_localrank-0.txt'}" in err
    assert main(["logs", str(tmp_path / "notes.txt"), *base]) == 2
    assert "notes.txt: not a run directory" in capsys.readouterr().err
    with pytest.raises(LaunchError, match="no launched run 'gone' in"):  # a name: looked up in the results
        run_dirs.find_run("gone", tmp_path / "results")


def test_a_run_name_under_results_that_no_launch_wrote_is_explained(tmp_path, capsys):
    """README's `gptrain train gpt3/126m` writes results/gpt3_126m, and `gptrain logs gpt3_126m` said
    "no launched run 'gpt3_126m' in results; pass a run dir": the run dir passed then said why. A
    name whose results/<name> is a `gptrain train` run, or only a dry run's preview, says it at once."""
    from gptrain.cli import main

    results = tmp_path / "results"
    trained = results / "gpt3_126m" / "results"
    trained.mkdir(parents=True)
    (trained / "nemo_log_globalrank-0_localrank-0.txt").write_text(LINE + "\n")
    (results / "gpt3_5b" / "dry-run").mkdir(parents=True)
    base = ["--results-dir", str(results)]
    assert main(["logs", "gpt3_126m", *base]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gptrain: error: {results / 'gpt3_126m'}: no launcher.log here or below")
    assert err.rstrip().endswith(f"its training log is {trained / 'nemo_log_globalrank-0_localrank-0.txt'}")
    assert main(["status", "gpt3_5b", *base]) == 2
    err = capsys.readouterr().err
    assert f"{results / 'gpt3_5b'}: no launcher.log here or below" in err
    assert "dry-run/ is a `gptrain launch --dry-run` preview, which submits nothing" in err
    (results / "gpt3_1p3b" / "20261129-041536" / "dry-run").mkdir(parents=True)  # unique_output=true
    assert main(["status", "gpt3_1p3b", *base]) == 2
    err = capsys.readouterr().err
    assert "20261129-041536/dry-run/ is a `gptrain launch --dry-run` preview, which submits nothing" in err
    with pytest.raises(LaunchError, match="no launched run 'gpt3_126' in"):  # no such dir: the names
        run_dirs.find_run("gpt3_126", results)


def test_status_names_a_unique_output_run_as_logs_takes_it(tmp_path, capsys):
    """unique_output=true launches into results/<run.name>/<time>: `gptrain status` named the run by
    its time alone, which `gptrain logs` refused ("no launched run '20261129-041536'") and which
    did not say which model it was."""
    from gptrain.cli import main

    results = tmp_path / "results"
    run = results / "gpt3_126m" / "20261129-041536"
    run.mkdir(parents=True)
    (run / "log.out").write_text(LINE + "\n")
    append_record(
        run,
        "submitted",
        stage="training",
        executor="local",
        job_id="local-1",
        pid=1,
        log=str(run / "log.out"),
    )
    append_record(run, "finished", job_id="local-1", exit_code=0)
    assert main(["status", "--results-dir", str(results)]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("gpt3_126m/20261129-041536  training  job local-1  COMPLETED")
    label = line.split()[0]
    assert main(["logs", label, "--results-dir", str(results)]) == 0
    assert capsys.readouterr().out == LINE + "\n"


def test_status_with_a_file_for_results_dir_is_an_error_not_no_runs(tmp_path, capsys):
    """`gptrain status --results-dir results.tar` said "no launched runs in .../results.tar" and
    exited 0, as if the launches were gone."""
    from gptrain.cli import main

    (tmp_path / "results.tar").write_text("x")
    assert main(["status", "--results-dir", str(tmp_path / "results.tar")]) == 2
    said = f"--results-dir {tmp_path / 'results.tar'}: is a file; give the base_results_dir of a launch (a directory)"
    assert capsys.readouterr() == ("", f"gptrain: error: {said}\n")
    assert (
        main(["status", "--results-dir", str(tmp_path / "none")]) == 0
    )  # nothing launched yet: not an error
    assert capsys.readouterr().out == f"no launched runs in {tmp_path / 'none'}\n"


def test_status_and_logs_under_a_directory_that_may_not_be_searched_are_one_line(unsearchable_dir, capsys):
    """Path.is_dir raised PermissionError (Python 3.11): a bare '<path>: Permission denied'. Root may
    search any directory, so the refusal is stood in for."""
    from gptrain.cli import main

    locked = unsearchable_dir
    why = f"cannot be looked up (Permission denied); check the permissions of {locked} and the directories above it"
    assert main(["status", "--results-dir", str(locked / "results")]) == 2
    assert capsys.readouterr() == ("", f"gptrain: error: {locked}/results: {why}\n")
    assert main(["logs", str(locked / "run")]) == 2
    assert capsys.readouterr() == ("", f"gptrain: error: {locked}/run/launcher.log: {why}\n")


def test_a_run_name_that_is_also_a_directory_here_still_gets_the_nearest_run(tmp_path, monkeypatch):
    """`gptrain status gpt3_126` from a directory holding a `gpt3_126/` of its own: the path is
    explained, and the launched run the user most likely meant is named."""
    (tmp_path / "results" / "gpt3_126m").mkdir(parents=True)
    (tmp_path / "results" / "gpt3_126m" / "launcher.log").write_text("")
    (tmp_path / "gpt3_126").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LaunchError) as error:
        run_dirs.find_run("gpt3_126", tmp_path / "results")
    assert "gpt3_126: no launcher.log here or below" in str(error.value)
    assert str(error.value).endswith(f"; of the runs in {tmp_path / 'results'} (did you mean 'gpt3_126m'?)")


def test_launcher_log_survives_a_torn_line(tmp_path):
    append_record(tmp_path, "submitted", job_id="1")
    with open(tmp_path / "launcher.log", "a") as handle:
        handle.write('{"event": "subm')
    assert [r["job_id"] for r in read_records(tmp_path)] == ["1"]
    assert json.loads((tmp_path / "launcher.log").read_text().splitlines()[0])["event"] == "submitted"
    assert os.path.getsize(tmp_path / "launcher.log") > 0


@pytest.mark.parametrize("command", ["status", "cancel"])
def test_a_submitted_record_without_a_job_id_is_skipped_as_a_torn_line_is(tmp_path, capsys, command):
    """A `submitted` line with no job id (hand-edited, or another tool's) was a KeyError traceback in
    `gptrain status` and `gptrain cancel`; it is no record of a job, as a line that is not JSON."""
    from gptrain.cli import main

    with open(tmp_path / "launcher.log", "w") as handle:
        handle.write('{"event": "submitted", "stage": "training"}\n{"event": "submitted", "job_id": [1]}\n')
    assert read_records(tmp_path) == []
    assert main([command, str(tmp_path)]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_log_files_fill_only_the_job_id_slot(tmp_path):
    """A run named `run%j` keeps its name; the id goes into the pattern's last %j (or %A_%a)."""
    run = tmp_path / "b%j" / "run%j"
    record = {"executor": "slurm", "job_id": "42", "log": f"{run}/log-run%j_%j.out"}
    assert run_dirs.log_files(record) == [run / "log-run%j_42.out"]
    run.mkdir(parents=True)
    for task in (0, 1, 10, 2):
        (run / f"log-a[1]%j_42_{task}.out").write_text("")
    array = {"executor": "slurm", "job_id": "42", "log": f"{run}/log-a[1]%j_%A_%a.out"}
    assert run_dirs.log_files(array) == [
        run / f"log-a[1]%j_42_{task}.out" for task in (0, 1, 2, 10)
    ]  # task order
    local = {"executor": "local", "job_id": "local-7", "pid": 7, "log": f"{run}/log-run%j_7.out"}
    assert run_dirs.log_files(local) == [run / "log-run%j_7.out"]


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")
def test_a_reused_pid_is_neither_running_nor_cancelled(tmp_path):
    """The launcher died without a `finished` line and its pid now names another process."""
    from gptrain.launch.records import process_start_time

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = process_start_time(other.pid)
        assert isinstance(started, int) and started == process_start_time(other.pid)
        fields = {"stage": "training", "executor": "local", "job_id": "local-9", "pid": other.pid, "log": "x"}
        append_record(tmp_path, "submitted", **fields, start_time=started - 1)  # the launcher's, long gone
        [line] = status.status_lines(tmp_path)
        assert "UNKNOWN (process gone without a recorded exit" in line and "another process" in line
        assert cancelling.cancel(tmp_path) == ["nothing to cancel"]
        assert other.poll() is None  # not signalled
        append_record(tmp_path, "submitted", **fields, start_time=started)  # this very process: running
        assert "RUNNING" in status.status_lines(tmp_path)[0]
        append_record(tmp_path, "submitted", **fields)  # an older record without a start time: as before
        assert "RUNNING" in status.status_lines(tmp_path)[0]
        assert cancelling.cancel(tmp_path) == ["cancelled training job local-9"]
        assert other.wait(10) == -15
    finally:
        other.kill()


def test_a_local_job_that_ends_just_before_its_cancel_is_said_not_a_traceback(tmp_path, monkeypatch):
    """The process ended between the state check and the signal: ProcessLookupError came out."""
    append_record(tmp_path, "submitted", stage="training", executor="local", job_id="local-5", pid=5, log="x")
    monkeypatch.setattr(cancelling, "job_state", lambda record, records: job_states.JobState("RUNNING"))

    def ended(pid, sig):
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(cancelling.os, "kill", ended)
    assert cancelling.cancel(tmp_path) == ["training job local-5 had already ended"]


def test_logs_stage_names_are_the_launchers_stages():
    """`logs --stage foo` printed nothing and exited 0; the parser's list must follow the launcher's."""
    from gptrain.launch.cli import STAGE_NAMES
    from gptrain.launch.compose import STAGES

    assert STAGE_NAMES == STAGES


@pytest.mark.parametrize(
    ("squeue_out", "live"),
    [
        ("100|RUNNING|None\n", True),
        ("100_3|PENDING|BeginTime\n100_4|RUNNING|None\n", True),  # an array: any task live
        ("", False),  # ended: squeue no longer lists it (sacct may still say RUNNING)
        ("100|PENDING|DependencyNeverSatisfied\n", False),  # never runs: a relaunch must go ahead
    ],
)
def test_a_live_slurm_job_of_the_latest_launch_holds_the_run_asked_in_one_squeue_call(
    tmp_path, monkeypatch, squeue_out, live
):
    import subprocess

    from gptrain.launch.records import append_record

    append_record(tmp_path, "submitted", stage="training", executor="slurm", job_id="90")  # superseded
    append_record(tmp_path, "submitted", stage="training", executor="slurm", job_id="100")
    calls = []

    def run_command(command, timeout=15.0):
        calls.append(command)
        return subprocess.CompletedProcess(command, 0, squeue_out, "")

    monkeypatch.setattr(slurm_queries, "run_command", run_command)
    found = live_jobs.live_jobs(tmp_path)
    assert [r["job_id"] for r, _ in found] == (["100"] if live else [])
    assert calls == [["squeue", "-h", "-j", "100", "-o", "%i|%T|%r"]]
    if live:
        with pytest.raises(LaunchError, match=r"job 100 \(training\) of this run is (RUNNING|.*RUNNING)"):
            live_jobs.refuse_launch_into_live_run([tmp_path])
    else:
        live_jobs.refuse_launch_into_live_run([tmp_path])


@pytest.mark.parametrize(
    ("states", "cancelled"),
    [
        # the data preparation is cancelled: the stages after it, in the training's dir, would never start
        ({"10": "RUNNING|None", "11": "PENDING|Dependency", "12": "PENDING|Dependency"}, ["10", "11", "12"]),
        # it failed earlier: nothing of its own to cancel, but the training waits for ever
        ({"11": "PENDING|DependencyNeverSatisfied", "12": "PENDING|Dependency"}, ["11", "12"]),
        # it completed and the training runs: another run's business
        ({"11": "COMPLETED|None", "12": "RUNNING|None"}, []),
    ],
)
def test_cancel_reaches_the_stages_of_the_launch_that_wait_in_another_run_dir(
    tmp_path, monkeypatch, states, cancelled
):
    import subprocess

    from gptrain.launch.records import append_record

    prep, train = tmp_path / "download_shards", tmp_path / "run"
    prep.mkdir(), train.mkdir()
    append_record(prep, "submitted", stage="data_preparation", executor="slurm", job_id="10", dependency=None)
    append_record(prep, "waited_on_by", after="10", job_id="11", waiting_dir=str(train))
    append_record(train, "submitted", stage="validation", executor="slurm", job_id="11", dependency="10")
    append_record(train, "submitted", stage="training", executor="slurm", job_id="12", dependency="11")
    scancelled = []

    def run_command(command, timeout=15.0):
        if command[0] == "scancel":
            scancelled.append(command[1])
            return subprocess.CompletedProcess(command, 0, "", "")
        if command[0] == "squeue":
            job = command[3]  # squeue -o %i|%T|%r
            return subprocess.CompletedProcess(
                command, 0, f"{job}|{states[job]}" if job in states else "", ""
            )
        return None  # finished and forgotten: scontrol, sacct

    monkeypatch.setattr(slurm_queries, "run_command", run_command)
    lines = cancelling.cancel(prep)
    assert scancelled == cancelled
    assert lines == (
        ["cancelled data_preparation job 10"] * ("10" in cancelled)
        + [
            f"cancelled {stage} job {job} of {train}, which waited on it"
            for stage, job in (("validation", "11"), ("training", "12"))
            if job in cancelled
        ]
        or ["nothing to cancel"]
    )


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_relaunch_cancels_the_jobs_of_the_previous_launch_that_never_start(tmp_path, monkeypatch, dry_run):
    """They would stay PENDING for ever, and status/cancel follow the new launch only."""
    import subprocess

    from gptrain.launch.records import append_record

    append_record(tmp_path, "submitted", stage="validation", executor="slurm", job_id="11", dependency="10")
    append_record(tmp_path, "submitted", stage="training", executor="slurm", job_id="12", dependency="11")
    squeue = "11|PENDING|Dependency\n12|PENDING|DependencyNeverSatisfied\n"
    scancelled = []

    def run_command(command, timeout=15.0):
        if command[0] == "scancel":
            scancelled.append(command[1])
        return subprocess.CompletedProcess(command, 0, squeue if command[0] == "squeue" else "", "")

    monkeypatch.setattr(slurm_queries, "run_command", run_command)
    lines = live_jobs.cancel_never_starting([tmp_path], dry_run=dry_run)
    assert scancelled == ([] if dry_run else ["12"])
    verb = "would cancel" if dry_run else "cancelled"
    assert lines == [f"{verb} training job 12 of the previous launch: it waited on job 11, which failed"]


def test_scancel_of_a_job_that_ended_meanwhile_is_no_error(monkeypatch):
    """A job cancelled by Slurm (kill_invalid_depend) or an admin between squeue and scancel."""
    import subprocess

    said = {"13": "scancel: error: Kill job error on job id 13: Job/step already completing or completed",
            "14": "scancel: error: Kill job error on job id 14: Invalid job id specified",
            "15": "scancel: error: Kill job error on job id 15: Access/permission denied"}  # fmt: skip
    monkeypatch.setattr(slurm_queries, "run_command", lambda command, timeout=15.0: subprocess.CompletedProcess(
        command, 1, "", said[command[1]]))  # fmt: skip
    slurm_queries.scancel("13")
    slurm_queries.scancel("14")
    with pytest.raises(LaunchError, match="^scancel 15 failed: .*permission denied"):
        slurm_queries.scancel("15")


@pytest.mark.parametrize(
    ("exit_code", "described"),
    [
        ("75:0", "FAILED (checkpoint saved but not requeued: max_requeues reached or the requeue failed;"),
        ("76:0", "FAILED (a rank hung, see the log; not requeued: launch again to resume from the last"),
        ("1:0", "FAILED (NonZeroExitCode) exit 1:0"),
    ],
)
def test_a_slurm_job_stopped_with_a_checkpoint_and_not_requeued_says_how_to_resume(
    monkeypatch, exit_code, described
):
    """It was 'FAILED (NonZeroExitCode) exit 75:0', as if the run were lost."""
    import subprocess

    scontrol = f"JobId=7 JobName=r\n   JobState=FAILED Reason=NonZeroExitCode ExitCode={exit_code}\n"

    def run_command(command, timeout=15.0):
        return subprocess.CompletedProcess(command, 0, scontrol if command[0] == "scontrol" else "", "")

    monkeypatch.setattr(slurm_queries, "run_command", run_command)
    state = record_state.slurm_state("7", "training")
    assert state.describe().startswith(described) and state.describe().endswith(f"exit {exit_code}")
    # another stage's 75 is EX_TEMPFAIL's (a data preparation's), not a checkpoint to resume from
    assert (
        record_state.slurm_state("7", "data_preparation").describe()
        == f"FAILED (NonZeroExitCode) exit {exit_code}"
    )


@pytest.mark.parametrize(
    ("scontrol", "described"),
    [
        ("JobState=CANCELLED Reason=Resources ExitCode=0:0", "CANCELLED"),
        ("JobState=CANCELLED Reason=Priority ExitCode=0:0", "CANCELLED"),
        ("JobState=CANCELLED Reason=QOSMaxJobsPerUserLimit ExitCode=0:0", "CANCELLED"),
        ("JobState=COMPLETED Reason=BeginTime ExitCode=0:0", "COMPLETED"),
        ("JobState=CANCELLED Reason=DependencyNeverSatisfied ExitCode=0:0", "CANCELLED (DependencyNeverSatisfied)"),
        ("JobState=PENDING Reason=Resources ExitCode=0:0", "PENDING (Resources)"),
        ("JobState=FAILED Reason=NonZeroExitCode ExitCode=2:0", "FAILED (NonZeroExitCode) exit 2:0"),
    ],
)  # fmt: skip
def test_an_ended_job_drops_the_reason_it_waited_in_the_queue_for(monkeypatch, scontrol, described):
    """Slurm keeps a pending job's Reason after a cancel: status said 'CANCELLED (Resources)', read as
    cancelled for want of resources. A waiting reason says nothing of how a job ended."""
    out = f"JobId=7 JobName=r\n   {scontrol}\n"
    monkeypatch.setattr(slurm_queries, "run_command", lambda command, timeout=15.0: subprocess.CompletedProcess(
        command, 0, out if command[0] == "scontrol" else "", ""))  # fmt: skip
    assert record_state.slurm_state("7", "data_preparation").describe() == described


def two_stage_launch(tmp_path, monkeypatch, sbatch: str, scancel: str):
    """A data_preparation + training Slurm plan, its run files written, with stub `sbatch` and
    `scancel` scripts (bash bodies) on PATH that append their calls to tmp_path/calls ($CALLS)."""
    from gptrain.launch.compose import compose
    from gptrain.launch.stages import build_plan, write_run_files

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("sbatch", sbatch), ("scancel", scancel)):
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(tmp_path / "calls"))
    monkeypatch.chdir(tmp_path)
    args = [
        "cluster_type=slurm",
        "stages=[data_preparation,training]",
        "data_preparation.shards=[http://h/a]",
    ]
    args += [f"base_results_dir={tmp_path}/r"]
    plan = build_plan(compose(args))
    write_run_files(plan, args)
    return plan


def test_a_stage_sbatch_refuses_withdraws_the_stages_this_launch_submitted(tmp_path, monkeypatch):
    """sbatch may refuse a later stage for what no preflight sees (EnforcePartLimits with a time
    above the partition's MaxTime, a QOS limit): the stages already submitted stayed queued, the
    data preparation ran for hours for no training, and they held the run dirs against the
    corrected relaunch. They are now cancelled, and the error says so."""
    from gptrain.launch.executors.slurm import submit

    sbatch = (
        'echo "sbatch $*" >> "$CALLS"\ncase "$*" in *afterok:101*) '
        'echo "sbatch: error: Batch job submission failed: Requested time limit is invalid" >&2; exit 1 ;; esac\n'
        "echo 101\n"
    )
    plan = two_stage_launch(tmp_path, monkeypatch, sbatch, 'echo "scancel $*" >> "$CALLS"\n')
    calls = tmp_path / "calls"
    with pytest.raises(LaunchError) as error:
        submit(plan)
    message = str(error.value)
    assert "Requested time limit is invalid" in message and "\n" not in message
    assert message.endswith("cancelled job 101 (data_preparation), which this launch had submitted")
    lines = calls.read_text().splitlines()
    assert lines[0].startswith("sbatch --parsable ") and "afterok:101" in lines[1]
    assert lines[2:] == ["scancel 101"]


def test_launcher_log_survives_lines_of_garbage(tmp_path, capsys):
    """Bytes that are not UTF-8 (a disk or NFS client that lost part of the file) and JSON lines
    that are not objects made status, logs and cancel tracebacks (UnicodeDecodeError,
    AttributeError 'list' object has no attribute 'get'), for every run under --results-dir."""
    from gptrain.cli import main

    run = tmp_path / "results" / "r"
    run.mkdir(parents=True)
    append_record(run, "submitted", stage="training", executor="local", job_id="local-1", pid=2**22 + 1)
    with open(run / "launcher.log", "ab") as handle:
        handle.write(b'\xc3\x28\xff garbage\n[1, 2]\n7\n"text"\nnull\n')
    append_record(run, "finished", stage="training", job_id="local-1", exit_code=0)
    assert [r["event"] for r in read_records(run)] == ["submitted", "finished"]
    assert main(["status", "--results-dir", str(tmp_path / "results")]) == 0
    assert "r  training  job local-1  COMPLETED" in capsys.readouterr().out


def test_the_status_eta_is_the_training_lines_own(tmp_path):
    """The line's time per iteration leaves validations and saves out; its own ETA (the wall-clock
    pace since the process's first line) counts them, and `gptrain status` now shows that one."""
    log = tmp_path / "log.out"
    with_eta = LINE + " ETA 31:02:03 |"
    log.write_text(LINE.replace("120/", "119/") + " ETA 31:02:04 |\n" + with_eta + "\n")
    assert status.progress(log) == "step 120/1000 | loss 3.2110 | 812 ms/step | ETA 31:02:03"
    log.write_text(LINE.replace("120/", "119/") + "\n" + LINE + "\n")  # lines without one (older runs)
    assert status.progress(log).endswith("| ETA 11:54")


@pytest.mark.parametrize(
    ("loss", "skipped", "shown"), [("0.000000E+00", 2, None), ("0.000000E+00", 0, "0.0000")]
)
def test_the_zero_loss_of_an_interval_of_skipped_iterations_is_no_loss_in_status(
    tmp_path, loss, skipped, shown
):
    """Megatron prints `lm loss: 0.000000E+00` for an interval whose iterations were all skipped (an fp16
    overflow streak): no loss was measured there, as the plot takes it, so status shows none."""
    log = tmp_path / "log.out"
    line = LINE.replace("lm loss: 3.210987E+00", f"lm loss: {loss}").replace(
        "skipped iterations:   0", f"skipped iterations: {skipped:3d}"
    )
    log.write_text(line + "\n")
    loss_part = f" | loss {shown}" if shown else ""
    assert status.progress(log) == f"step 120/1000{loss_part} | 812 ms/step"


@pytest.mark.parametrize(
    ("pending", "prep_cancelled", "said"),
    [
        ("", True, "cancelled data_preparation job 101 of {prep}, which no other job waited on"),
        # another launch's (or anyone's) job waits on the same preparation: it keeps it
        ("55|afterok:101_*(unfulfilled)\n", False, "left data_preparation job 101 of {prep} RUNNING: job 55 waits on it too"),
    ],
)  # fmt: skip
def test_cancel_of_a_training_cancels_the_data_preparation_it_alone_waited_on(
    tmp_path, monkeypatch, pending, prep_cancelled, said
):
    """`gptrain cancel <training run>` cancelled the training and left the data preparation its
    launch had submitted (another run dir) downloading and tokenizing for hours, for nothing."""
    from gptrain.launch.compose import compose
    from gptrain.launch.executors.slurm import submit
    from gptrain.launch.stages import build_plan, write_run_files

    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    (tmp_path / "pending").write_text(pending)
    for name, body in (
        ("sbatch", 'n=$(grep -c sbatch "$CALLS" 2>/dev/null); echo "sbatch $*" >> "$CALLS"; echo $((101 + n))\n'),
        ("scancel", 'echo "scancel $*" >> "$CALLS"\n'),
        ("scontrol", "exit 1\n"),  # no such job (for an array's other tasks): squeue's answer stands
        # squeue -j ID: the preparation runs (an array task), the training waits; -t PENDING: dependencies
        ("squeue", 'case "$*" in *"-t PENDING"*) cat "$PENDING_FILE" ;; *"-j 101"*) echo "101_0|RUNNING|None" ;;'
         ' *"-j 102"*) echo "102|PENDING|Dependency" ;; esac\n'),
    ):  # fmt: skip
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(calls))
    monkeypatch.setenv("PENDING_FILE", str(tmp_path / "pending"))
    monkeypatch.chdir(tmp_path)
    args = [
        "cluster_type=slurm",
        "stages=[data_preparation,training]",
        "data_preparation.shards=[http://h/a]",
    ]
    args += [f"base_results_dir={tmp_path}/r"]
    plan = build_plan(compose(args))
    write_run_files(plan, args)
    assert submit(plan) == ["101", "102"]
    prep, train = (job.run_dir for job in plan.jobs)
    assert prep != train
    lines = cancelling.cancel(train)
    assert lines == ["cancelled training job 102", said.format(prep=prep)]
    scancelled = [line for line in calls.read_text().splitlines() if line.startswith("scancel")]
    assert scancelled == ["scancel 102", "scancel 101"] if prep_cancelled else ["scancel 102"]


@pytest.mark.parametrize("state", ["SIGNALING", "EXPEDITING", "STAGE_OUT", "RESV_DEL_HOLD", "SPECIAL_EXIT"])
def test_a_job_squeue_shows_by_a_state_flag_is_still_live(tmp_path, monkeypatch, state):
    """squeue names a flag before the base state (Slurm's job_state_string): a running job being
    suspended or gang-scheduled is SIGNALING, a requeued one EXPEDITING (25.11). They were taken
    for ended: `gptrain cancel` said 'nothing to cancel' of a running job, and a relaunch went ahead
    over it."""
    append_record(tmp_path, "submitted", stage="training", executor="slurm", job_id="100", log="x")
    scancelled = []

    def run_command(command, timeout=15.0):
        if command[0] == "scancel":
            scancelled.append(command[1])
        out = f"100|{state}|None\n" if command[0] == "squeue" else ""
        return subprocess.CompletedProcess(command, 0, out, "")

    monkeypatch.setattr(slurm_queries, "run_command", run_command)
    with pytest.raises(LaunchError, match=f"job 100 \\(training\\) of this run is {state}"):
        live_jobs.refuse_launch_into_live_run([tmp_path])
    assert cancelling.cancel(tmp_path) == ["cancelled training job 100"] and scancelled == ["100"]


@pytest.mark.parametrize(
    ("said", "keys"),
    [
        ("Invalid partition name specified", "cluster.partition"),
        ("Invalid account or account/partition combination specified", "cluster.account and cluster.partition"),
        ("Requested time limit is invalid (missing or exceeds some limit)",
         "training.run.time_limit (at most the partition's MaxTime)"),
        ("Invalid generic resource (gres) specification", "cluster.gres"),
        ("Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)",
         "cluster.qos and cluster.account, or ask for fewer nodes or less training.run.time_limit"),
        ("Node count specification invalid", "training.trainer.num_nodes and cluster.nodelist"),
        ("Invalid node name specified", "cluster.nodelist, cluster.exclude and validation.exclude_file"),
    ],
)  # fmt: skip
def test_an_sbatch_refusal_names_the_keys_to_fix(tmp_path, monkeypatch, said, keys):
    """sbatch's refusal came through as Slurm's words only ('Invalid partition name specified'),
    leaving the user to find which of the launch's keys set it."""
    from gptrain.launch.executors.slurm import sbatch

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        f"#!/bin/bash\necho {shlex.quote('sbatch: error: Batch job submission failed: ' + said)} >&2\nexit 1\n"
    )
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    job = Job("training", "r", "gptrain-r", tmp_path, [])
    with pytest.raises(LaunchError) as error:
        sbatch(job, None)
    assert str(error.value) == (
        f"sbatch refused {job.script_path}: sbatch: error: Batch job submission failed: {said}; check {keys}"
    )


@pytest.mark.parametrize(
    ("printed", "job_id"),
    [
        ("101", "101"),
        ("101;cluster-a", "101"),  # a federation or multi-cluster site
        ("site notice: GPUs are billed by the hour\n101", "101"),  # a site's sbatch wrapper
        ("Submitted batch job 101", "101"),  # a wrapper that drops --parsable
    ],
)
def test_the_job_id_is_read_from_what_sbatch_prints(tmp_path, monkeypatch, printed, job_id):
    """A site's sbatch wrapper printing a line before the id made the whole text the 'job id': the
    next stage was submitted with --dependency=afterok:<that text>, and status asked squeue of it."""
    from gptrain.launch.compose import compose
    from gptrain.launch.executors.slurm import submit
    from gptrain.launch.stages import build_plan, write_run_files

    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        f'#!/bin/bash\necho "sbatch $*" >> "$CALLS"\necho {shlex.quote(printed)}\n'
    )
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(calls))
    monkeypatch.chdir(tmp_path)
    args = [
        "cluster_type=slurm",
        "stages=[data_preparation,training]",
        "data_preparation.shards=[http://h/a]",
    ]
    plan = build_plan(compose([*args, f"base_results_dir={tmp_path}/r"]))
    write_run_files(plan, args)
    assert submit(plan) == [job_id, job_id]
    assert f"--dependency=afterok:{job_id},singleton " in calls.read_text().splitlines()[1]
    assert [r["job_id"] for r in read_records(plan.jobs[-1].run_dir)] == [job_id]


def test_sbatch_printing_no_job_id_is_one_line_saying_where_to_look(tmp_path, monkeypatch):
    from gptrain.launch.executors.slurm import sbatch

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/bash\necho 'queued, thank you'\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    job = Job("training", "r", "gptrain-r", tmp_path, [])
    with pytest.raises(LaunchError) as error:
        sbatch(job, None)
    assert str(error.value) == (
        f"sbatch accepted {job.script_path} but printed no job id (it printed: queued, thank you); its job may"
        " be queued: look for job name 'gptrain-r' in squeue"
    )


def test_a_partition_of_mixed_nodes_fits_only_as_many_nodes_as_are_large_enough():
    """The preflight held the request against the largest node: 4 nodes of 8 GPUs were 'ok' in a
    partition with two such nodes and six of 4 GPUs, which Slurm refuses or queues forever."""
    mixed = [Node(f"big{i}", "gpu", True, 64, 8, "idle") for i in range(2)]
    mixed += [Node(f"small{i}", "gpu", True, 64, 4, "idle") for i in range(6)]
    job = Job("training", "r", "r", None, [], nodes=4, tasks_per_node=8, gpus=True)
    with pytest.raises(LaunchError) as error:
        check_cluster(job, {"gres": "gpu:8"}, mixed)
    assert str(error.value) == (
        "training: 4 node(s) of 8 CPUs and 8 GPUs requested but partition 'gpu' has 2 such (of 8 usable);"
        " Slurm would refuse it or queue it forever: lower training.trainer.num_nodes or the GPUs/tasks per"
        " node, or pick another cluster.partition"
    )
    two = Job("training", "r", "r", None, [], nodes=2, tasks_per_node=8, gpus=True)
    assert check_cluster(two, {"gres": "gpu:8"}, mixed) == (
        "ok  training: partition gpu, 2/2 nodes, 8/64 CPUs, 8/8 GPUs per node"
    )
    # mixed CPUs too: 3 nodes of 16 CPU tasks where only two nodes have 16 CPUs
    cpus = [Node("a", "cpu", True, 16, 0, "idle"), Node("b", "cpu", True, 16, 0, "mixed")]
    cpus.append(Node("c", "cpu", True, 4, 0, "idle"))
    with pytest.raises(LaunchError, match="has 2 such \\(of 3 usable\\)"):
        check_cluster(Job("training", "r", "r", None, [], nodes=3, tasks_per_node=16), {}, cpus)
    # a constraint (node features the preflight does not read) may pick the large nodes: left to Slurm
    assert "4/8 nodes" in check_cluster(job, {"gres": "gpu:8", "constraint": "h100"}, mixed)


@pytest.mark.parametrize(
    ("tail", "described"),
    [
        (["gptrain: step finished with exit code 0"],
         "COMPLETED (Slurm no longer knows the job; from its log)"),
        ([SAVED, "gptrain: exit 75 but max_requeues=0 reached; not requeueing",
          "gptrain: step finished with exit code 75"],
         "FAILED (checkpoint saved but not requeued: max_requeues reached or the requeue failed; launch again"
         " to resume) exit 75:0"),
        ([SAVED, "gptrain: the job was cancelled (scancel): not requeueing; launch again to resume",
          "gptrain: step finished with exit code 75"],
         "CANCELLED (Slurm no longer knows the job; from its log: cancelled, launch again to resume) exit 75:0"),
        (["Traceback (most recent call last):", "gptrain: step finished with exit code 1"],
         "FAILED (Slurm no longer knows the job; from its log) exit 1:0"),
        ([], "UNKNOWN (no longer known to Slurm; no accounting to ask)"),  # killed, or still running
    ],
)  # fmt: skip
def test_a_training_slurm_forgot_without_accounting_ends_as_its_log_says(
    tmp_path, monkeypatch, tail, described
):
    """Past MinJobAge (300 s by default) scontrol no longer knows a job, and without slurmdbd (a plain
    ParallelCluster) sacct cannot say either: every ended training was 'UNKNOWN'. The batch script's
    last line says how it ended."""
    log = tmp_path / "log-r_7.out"
    log.write_text("\n".join(["gptrain: job 7 on n1, stage training", LINE, *tail]) + "\n")
    append_record(tmp_path, "submitted", stage="training", executor="slurm", job_id="7",
                  log=str(tmp_path / "log-r_%j.out"), dependency=None)  # fmt: skip

    def run_command(command, timeout=15.0):
        if command[0] == "squeue":
            return subprocess.CompletedProcess(
                command, 1, "", "slurm_load_jobs error: Invalid job id specified"
            )
        if command[0] == "scontrol":
            return subprocess.CompletedProcess(
                command, 1, "", "slurm_load_jobs error: Invalid job id specified"
            )
        return subprocess.CompletedProcess(
            command, 1, "", "sacct: error: Slurm accounting storage is disabled"
        )

    monkeypatch.setattr(slurm_queries, "run_command", run_command)
    [line] = status.status_lines(tmp_path)
    assert line.startswith(f"{tmp_path.name}  training  job 7  {described}  | step 120/1000")
    assert cancelling.cancel(tmp_path) == ["nothing to cancel"]


def test_an_sbatch_that_never_answers_says_its_job_may_be_queued(tmp_path, monkeypatch):
    """A controller that took the job and then went quiet: the line said 'is Slurm installed here?',
    and a relaunch queued the same stage twice."""
    from gptrain.launch.executors import slurm

    def timed_out(command, **kwargs):
        raise subprocess.TimeoutExpired(command, kwargs.get("timeout"))

    monkeypatch.setattr(slurm.subprocess, "run", timed_out)
    job = Job("training", "r", "gptrain-r", tmp_path, [])
    with pytest.raises(LaunchError) as error:
        slurm.sbatch(job, None)
    assert str(error.value) == (
        f"sbatch gave no answer in 60 s for {job.script_path} (a busy or failing-over controller); its job may"
        " be queued all the same: look for job name 'gptrain-r' in squeue before launching again"
    )


def test_a_node_that_registered_invalid_is_not_counted_usable():
    """sinfo says `inval` of a node that registered with fewer CPUs, GPUs or memory than slurm.conf
    gives it (Slurm 21.08+): Slurm schedules nothing there, but the preflight counted it."""
    cluster = nodes(count=1) + nodes(state="inval")[1:]
    with pytest.raises(LaunchError, match="2 node\\(s\\) requested but partition 'debug' has 1 usable"):
        check_cluster(Job("training", "r", "r", None, [], nodes=2, tasks_per_node=2), {}, cluster)


def forgotten_by_slurm(command, timeout=15.0):
    """squeue and scontrol past MinJobAge, and sacct without slurmdbd: none knows the job."""
    return subprocess.CompletedProcess(command, 1, "", "Invalid job id specified")


@pytest.mark.parametrize(
    ("task_codes", "described"),
    [
        ({"0": 0, "1": 0}, "ARRAY[2 COMPLETED] (Slurm no longer knows the job; from its log)"),
        ({"0": 0, "1": 3}, "ARRAY[1 COMPLETED, 1 FAILED] (Slurm no longer knows the job; from its log) exit 3:0"),
        ({"0": 0}, "UNKNOWN (no longer known to Slurm; no accounting to ask)"),  # task 1 never ran
    ],
)  # fmt: skip
def test_a_data_preparation_slurm_forgot_without_accounting_ends_as_its_tasks_logs_say(
    tmp_path, monkeypatch, task_codes, described
):
    """Past MinJobAge without slurmdbd, only the training's end was read from its log: a finished
    data preparation (or validation) stayed UNKNOWN. Each stage's script now ends with the line."""
    from gptrain.launch.compose import compose
    from gptrain.launch.executors.slurm import submit
    from gptrain.launch.stages import build_plan, write_run_files

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (
        ("sbatch", "echo 101\n"),
        ("srun", 'exit "$(cat "$CODES/$SLURM_ARRAY_TASK_ID")"\n'),  # the task's step, by its code
    ):
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    args = [
        "cluster_type=slurm",
        "stages=[data_preparation]",
        "data_preparation.shards=[http://h/a,http://h/b]",
    ]
    args += [f"base_results_dir={tmp_path}/r"]
    plan = build_plan(compose(args))
    [script] = write_run_files(plan, args)
    assert submit(plan) == ["101"]
    [job] = plan.jobs
    codes = tmp_path / "codes"
    codes.mkdir()
    for task, code in task_codes.items():  # each task's batch shell, its output where sbatch puts it
        (codes / task).write_text(str(code))
        env = {**os.environ, "CODES": str(codes), "SLURM_JOB_ID": "101", "SLURM_JOB_NODELIST": "n1"}
        env["SLURM_ARRAY_TASK_ID"] = task
        with open(job.run_dir / f"log-{job.job_name}_101_{task}.out", "w") as log:
            done = subprocess.run(["bash", str(script)], env=env, stdout=log, stderr=subprocess.STDOUT)
        assert done.returncode == code
    monkeypatch.setattr(slurm_queries, "run_command", forgotten_by_slurm)
    [line] = status.status_lines(job.run_dir)
    assert line == f"{job.run_dir.name}  data_preparation  job 101  {described}"


def test_every_stage_script_ends_with_the_line_status_reads(tmp_path, monkeypatch):
    """The validation's (and data preparation's) log said nothing of how it ended: once Slurm forgot
    the job, status had nothing to go by."""
    from gptrain.launch.compose import compose
    from gptrain.launch.stages import build_plan, write_run_files

    monkeypatch.chdir(tmp_path)
    args = [
        f"base_results_dir={tmp_path}",
        "cluster_type=slurm",
        "stages=[data_preparation,validation,training]",
    ]
    args += ["data_preparation.shards=[http://h/a]"]
    for script in write_run_files(build_plan(compose(args)), args):
        ending = script.read_text().rstrip().splitlines()[-2:]
        assert ending == ['echo "gptrain: step finished with exit code $status" >&2', 'exit "$status"']


def test_a_controller_that_does_not_answer_is_not_taken_for_jobs_that_ended(tmp_path, monkeypatch):
    """squeue failing to reach the controller read as 'no longer known to Slurm', and `gptrain
    cancel` said 'nothing to cancel' and cancelled nothing while the training went on running."""
    append_record(tmp_path, "submitted", stage="training", executor="slurm", job_id="7",
                  log=str(tmp_path / "log-r_%j.out"), dependency=None)  # fmt: skip
    down = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"

    def run_command(command, timeout=15.0):
        if command[0] == "sacct":
            return subprocess.CompletedProcess(
                command, 1, "", "sacct: error: Slurm accounting storage is disabled"
            )
        if command[0] == "scancel":
            text = "scancel: error: Kill job error on job id 7: Unable to contact slurm controller (connect failure)"
            return subprocess.CompletedProcess(command, 1, "", text)
        return subprocess.CompletedProcess(command, 1, "", down)

    monkeypatch.setattr(
        shutil, "which", lambda name: f"/usr/bin/{name}"
    )  # Slurm is here: squeue failing is its silence
    monkeypatch.setattr(slurm_queries, "run_command", run_command)
    [line] = status.status_lines(tmp_path)
    assert line == f"{tmp_path.name}  training  job 7  UNKNOWN (Slurm did not answer: {down})"
    with pytest.raises(LaunchError, match=r"^scancel 7 failed: .*Unable to contact slurm controller"):
        cancelling.cancel(tmp_path)


@pytest.mark.parametrize("squeue_here", [True, False])
def test_a_launch_into_a_run_whose_jobs_slurm_cannot_be_asked_about_is_refused(
    tmp_path, monkeypatch, squeue_here
):
    """squeue failing (a controller down or timing out) read as 'no live job': the launch rewrote the
    config and scripts a running training re-reads at its requeue. Without squeue at all (a run dir
    from another cluster) there is nothing to ask, as before."""
    append_record(tmp_path, "submitted", stage="training", executor="slurm", job_id="100")
    down = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"

    def run_command(command, timeout=15.0):
        return subprocess.CompletedProcess(command, 1, "", down) if squeue_here else None

    monkeypatch.setattr(slurm_queries, "run_command", run_command)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}" if squeue_here else None)
    if not squeue_here:
        live_jobs.refuse_launch_into_live_run([tmp_path])
        return
    with pytest.raises(LaunchError) as error:
        live_jobs.refuse_launch_into_live_run([tmp_path])
    assert str(error.value) == (
        f"{tmp_path}: cannot tell whether Slurm job 100 of this run is still queued or running ({down});"
        " launch again once Slurm answers"
    )


@pytest.mark.parametrize(
    ("tail", "ending"),
    [
        ([SAVED, "gptrain: Slurm requeued the job itself (preemption): it resumes when it starts again",
          "gptrain: step finished with exit code 75"], "its log's last attempt ended with exit code 75"),
        (["gptrain: step finished with exit code 0"], "its log's last attempt ended with exit code 0"),
        ([SAVED, "gptrain: the job was cancelled (scancel): not requeueing; launch again to resume",
          "gptrain: step finished with exit code 75"], "its log's last attempt was cancelled"),
    ],
)  # fmt: skip
def test_a_log_that_ended_does_not_settle_a_job_slurm_did_not_answer_about(
    tmp_path, monkeypatch, tail, ending
):
    """A training Slurm preempted and requeued is PENDING again with its last attempt's exit line in
    its log: with squeue not answering, status read that line ('FAILED (checkpoint saved but not
    requeued ...)' or 'Slurm no longer knows the job') and cancel skipped the queued job ('nothing
    to cancel'). The state stays 'Slurm did not answer', the log's ending beside it, and cancel
    scancels the job."""
    (tmp_path / "log-r_7.out").write_text("\n".join(["gptrain: job 7 on n1, stage training", *tail]) + "\n")
    append_record(tmp_path, "submitted", stage="training", executor="slurm", job_id="7",
                  log=str(tmp_path / "log-r_%j.out"), dependency=None)  # fmt: skip
    down = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
    cancelled = []

    def run_command(command, timeout=15.0):
        if command[0] == "scancel":  # the controller is back
            cancelled.append(command[1])
            return subprocess.CompletedProcess(command, 0, "", "")
        return subprocess.CompletedProcess(command, 1, "", down)

    monkeypatch.setattr(
        shutil, "which", lambda name: f"/usr/bin/{name}"
    )  # Slurm is here: squeue failing is its silence
    monkeypatch.setattr(slurm_queries, "run_command", run_command)
    [line] = status.status_lines(tmp_path)
    assert line == f"{tmp_path.name}  training  job 7  UNKNOWN (Slurm did not answer: {down}; {ending})"
    assert cancelling.cancel(tmp_path) == ["cancelled training job 7"]
    assert cancelled == ["7"]


def test_an_array_slurm_did_not_answer_about_says_how_its_tasks_logs_end(tmp_path, monkeypatch):
    """As for one job: the tasks' exit lines are said beside 'Slurm did not answer', not taken for its state."""
    for task, code in (("0", 0), ("1", 3)):
        (tmp_path / f"log-p_101_{task}.out").write_text(f"gptrain: step finished with exit code {code}\n")
    append_record(tmp_path, "submitted", stage="data_preparation", executor="slurm", job_id="101",
                  array=2, log=str(tmp_path / "log-p_%A_%a.out"), dependency=None)  # fmt: skip
    down = "squeue: error: Socket timed out on send/recv operation"
    monkeypatch.setattr(
        shutil, "which", lambda name: f"/usr/bin/{name}"
    )  # Slurm is here: squeue failing is its silence
    monkeypatch.setattr(
        slurm_queries,
        "run_command",
        lambda command, timeout=15.0: subprocess.CompletedProcess(command, 1, "", down),
    )
    assert status.status_lines(tmp_path) == [
        f"{tmp_path.name}  data_preparation  job 101  UNKNOWN (Slurm did not answer: {down};"
        " its tasks' logs say their last attempts ended: 1 COMPLETED, 1 FAILED)"
    ]


@pytest.mark.parametrize(
    ("tail", "ending"),
    [
        ([], ""),
        (["gptrain: step finished with exit code 0"], "; its log's last attempt ended with exit code 0"),
    ],
)
def test_status_and_cancel_without_slurm_here_say_so(tmp_path, monkeypatch, capsys, tail, ending):
    """A Slurm run dir looked at from a machine without Slurm (no squeue on PATH): status said
    'Slurm did not answer: squeue did not run', and cancel failed with 'scancel 4242 failed: no
    scancel', where a launch's check of the same run dir knows there is nothing here to ask."""
    from gptrain.cli import main

    (tmp_path / "log-train_4242.out").write_text(
        "\n".join(["gptrain: job 4242 on n1, stage training", *tail]) + "\n"
    )
    append_record(tmp_path, "submitted", stage="training", executor="slurm", job_id="4242",
                  log=str(tmp_path / "log-train_%j.out"), dependency=None)  # fmt: skip
    asked = []

    def nothing_to_run(command, timeout=15.0):  # run_command of a command not on PATH
        asked.append(command[0])
        return None

    monkeypatch.setattr(
        shutil, "which", lambda name: f"/usr/bin/{name}"
    )  # Slurm is here: squeue failing is its silence
    monkeypatch.setattr(slurm_queries, "run_command", nothing_to_run)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    no_slurm = "no Slurm commands on this machine: run gptrain status/cancel on the cluster"
    assert main(["status", str(tmp_path)]) == 0
    assert capsys.readouterr() == (f"{tmp_path.name}  training  job 4242  UNKNOWN ({no_slurm}{ending})\n", "")
    assert main(["cancel", str(tmp_path)]) == 2
    assert capsys.readouterr() == ("", f"gptrain: error: {tmp_path}: {no_slurm}\n")
    assert "scancel" not in asked
    assert live_jobs.queued_jobs(tmp_path) == []  # the launch's check: nothing to ask here, as before


NCCL_INFO = "n1:1234:1301 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"


class CountedReads:
    """An open file that adds what is read from it to `counted`."""

    def __init__(self, handle, counted: list[int]):
        self.handle, self.counted = handle, counted

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()

    def __iter__(self):
        for line in self.handle:
            self.counted.append(len(line))
            yield line

    def read(self, *args):
        data = self.handle.read(*args)
        self.counted.append(len(data))
        return data

    def seek(self, *args):
        return self.handle.seek(*args)


def test_status_reads_a_long_log_from_its_end(tmp_path, monkeypatch):
    """A week-long run with NCCL_DEBUG=INFO writes gigabytes of log, and status read all of it for
    the progress line, the exit line and the stop line, each time. Now it reads from the end, back
    to what it needs: here 48 MiB of NCCL lines between the start and the last lines stay unread."""
    from gptrain.launch import log_endings

    counted: list[int] = []

    def counted_open(path, *args, **kwargs):
        return CountedReads(open(path, *args, **kwargs), counted)

    for module in (status, log_endings):
        monkeypatch.setattr(module, "open", counted_open, raising=False)
    banner = "gptrain: 124,082,688 parameters | 6.306e+12 FLOPs per iteration | 1 microbatches per step\n"
    log = tmp_path / "log-r_7.out"
    with open(log, "w") as handle:
        handle.write(f"gptrain: job 7 on n1, stage training\n{banner}{LINE.replace('120/', '1/')}\n")
        handle.write(NCCL_INFO * (48 * 2**20 // len(NCCL_INFO)))
        handle.write(f"{LINE.replace('120/', '119/')}\n{NCCL_INFO}{LINE}\n{NCCL_INFO * 100}{SAVED}\n")
        handle.write("gptrain: the job was cancelled (scancel): not requeueing; launch again to resume\n")
        handle.write("gptrain: step finished with exit code 75\n")
    assert status.progress(log) == "step 120/1000 | loss 3.2110 | 812 ms/step | ETA 11:54"
    record = {"stage": "training", "executor": "slurm", "job_id": "7", "log": str(tmp_path / "log-r_%j.out")}
    assert log_endings.ended_by_log(record).describe() == (
        "CANCELLED (Slurm no longer knows the job; from its log: cancelled, launch again to resume) exit 75:0"
    )
    assert log_endings.early_stop_of(record) is None  # the last stop saved a checkpoint
    assert (
        sum(counted) < 6 * 2**20
    )  # the three reads together: an eighth of the log (old: three times all of it)


@pytest.mark.parametrize("block", [1, 2, 3, 7, 1 << 20])
def test_lines_from_the_end_are_the_files_lines_reversed(tmp_path, block):
    """Whatever the block boundaries cut: a CRLF, a character of several bytes, a last line without
    its line break. Blank lines aside (a cut CRLF reads as two breaks), as a text-mode file reads them."""
    from gptrain.launch.log_endings import lines_from_the_end

    text = "first\r\nsecond é line\rthird\n\nfifth ✓\r\nlast, unended"
    path = tmp_path / "log.out"
    path.write_bytes(text.encode())
    read = [line for line in lines_from_the_end(path, block=block) if line]
    with open(path, errors="replace") as handle:
        assert read == [line.rstrip("\n") for line in reversed(list(handle)) if line != "\n"]
    assert list(lines_from_the_end(path, holding=("line", "✓"), block=block)) == ["fifth ✓", "second é line"]


class CountedBytes(bytes):
    """Bytes that add to `counted` what each search, slice or join of them goes through."""

    counted: list[int] = []

    def made(self, data: bytes) -> "CountedBytes":
        self.counted.append(len(data))
        return CountedBytes(data)

    def __add__(self, other):
        return self.made(bytes(self) + bytes(other))

    def __radd__(self, other):
        return self.made(bytes(other) + bytes(self))

    def __getitem__(self, index):
        return self.made(bytes(self)[index]) if isinstance(index, slice) else bytes(self)[index]

    def __contains__(self, needle):
        self.counted.append(len(self))
        return bytes.__contains__(self, needle)


def test_lines_from_the_end_go_through_a_long_unbroken_stretch_once(tmp_path, monkeypatch):
    """After an NFS client crash a log can end in hundreds of MB of NULs without a line break: each
    block was put before the stretch read so far, and that copied and searched again, minutes for
    256 MB. Now each block is gone through a few times, whatever its line's length; the exit line
    before the stretch and a needle across a block boundary are still found."""
    from gptrain.launch import log_endings

    class CountedFile:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def read(self, *args):
            return CountedBytes(self.handle.read(*args))

        def seek(self, *args):
            return self.handle.seek(*args)

    def counted_open(path, *args, **kwargs):
        return CountedFile(open(path, *args, **kwargs))

    monkeypatch.setattr(CountedBytes, "counted", [])
    monkeypatch.setattr(log_endings, "open", counted_open, raising=False)
    block, size = 4096, 2**20
    log = tmp_path / "job_7.out"
    exit_line, across = b"gptrain: step finished with exit code 0\n", b"gptrain: " + b"\0" * (block - 4)
    log.write_bytes(exit_line + b"\0" * size + across)  # the last block boundary cuts `across`'s needle
    lines = list(log_endings.lines_from_the_end(log, holding=("gptrain: ",), block=block))
    assert lines == [("\0" * size + across.decode()), exit_line.decode().strip()]
    assert sum(CountedBytes.counted) < 4 * size  # about once (old: 261 times)


def test_an_exit_line_after_a_cut_line_ends_the_log_for_status_and_follow(tmp_path):
    """A rank killed mid-line (OOM, SIGKILL) leaves no line break, and the batch script's exit line
    joins its partial line: status read the job's end there, while `logs -f` (ends_with_exit_line,
    matching at the line's start) kept following a job that was over. Both read it now."""
    from gptrain.launch.log_endings import ends_with_exit_line, log_ending

    log = tmp_path / "job_7.out"
    log.write_text("iteration 5/10 | loss 3.2 | some partial outpgptrain: step finished with exit code 137\n")
    assert log_ending(log).exit_code == "137:0"
    assert ends_with_exit_line(log)


def test_status_with_the_controller_down_waits_out_one_timeout_not_one_per_job(tmp_path, monkeypatch, capsys):
    """With the controller down, `gptrain status` asked squeue, scontrol and sacct job by job, each
    waiting out its timeout: about 2 minutes for 4 jobs. Slurm is now not asked again once it gave
    no answer, the command says so once, and each job's state comes from its log and record."""
    from gptrain.cli import main

    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    for name in ("squeue", "scontrol", "sacct"):
        (bin_dir / name).write_text(f'#!/bin/bash\necho {name} >> "$CALLS"\nexec sleep 30\n')
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(calls))
    monkeypatch.setattr(slurm_queries, "SLURM_TIMEOUT_S", 1.0, raising=False)  # 15 s before
    results = tmp_path / "results"
    for job in range(1, 5):
        run = results / f"run{job}"
        run.mkdir(parents=True)
        (run / f"log-train_{job}.out").write_text(
            f"gptrain: job {job} on n1\ngptrain: step finished with exit code 0\n"
        )
        append_record(run, "submitted", stage="training", executor="slurm", job_id=str(job),
                      log=str(run / "log-train_%j.out"), dependency=None)  # fmt: skip
    started = time.monotonic()
    assert main(["status", "--results-dir", str(results)]) == 0
    took = time.monotonic() - started
    out = capsys.readouterr().out.splitlines()
    assert calls.read_text().splitlines() == ["squeue"]  # the one question that timed out
    assert took < 1.0 + 5.0, took  # one timeout and the fakes' start, not 12 of them
    assert out[:4] == [
        f"run{job}  training  job {job}  UNKNOWN (Slurm did not answer; its log's last attempt ended with exit code 0)"
        for job in range(1, 5)
    ]
    assert out[4:] == [
        "note  Slurm did not answer (squeue gave no answer in 1 s): not asked again by this command; the states"
        " of its jobs come from their logs and launcher records"
    ]


def test_status_with_accounting_down_still_asks_the_controller_for_each_job(tmp_path, monkeypatch, capsys):
    """slurmdbd not answering (sacct times out) says nothing of the controller: squeue is still asked
    for every job, and sacct only once."""
    from gptrain.cli import main

    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    for name, body in (
        ("squeue", 'case "$*" in *"-j 2 "*) echo "2|RUNNING|None" ;; esac'),
        ("scontrol", "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1"),
        ("sacct", "exec sleep 30"),
    ):  # fmt: skip
        (bin_dir / name).write_text(f'#!/bin/bash\necho {name} >> "$CALLS"\n{body}\n')
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(calls))
    monkeypatch.setattr(slurm_queries, "SLURM_TIMEOUT_S", 1.0)
    results = tmp_path / "results"
    for job in (1, 2):
        run = results / f"run{job}"
        run.mkdir(parents=True)
        append_record(run, "submitted", stage="training", executor="slurm", job_id=str(job),
                      log=str(run / "log-train_%j.out"), dependency=None)  # fmt: skip
    assert main(["status", "--results-dir", str(results)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert calls.read_text().splitlines() == ["squeue", "scontrol", "sacct", "squeue"]
    assert out[1] == "run2  training  job 2  RUNNING"
    assert out[2].startswith("note  Slurm did not answer (sacct gave no answer in 1 s)")


def test_sbatch_variables_in_the_shell_do_not_override_the_keys_preflight_checked(tmp_path, monkeypatch):
    """SBATCH_PARTITION, SBATCH_TIMELIMIT, ... in the user's shell override a script's #SBATCH lines,
    so the job ran in another partition, with another time limit, than the config and preflight said.
    gptrain's keys are the launch's command line (which sbatch takes over them): a variable for a
    line the script has is left out of the sbatch call and said once; the others apply."""
    from gptrain.launch.compose import compose
    from gptrain.launch.executors import slurm
    from gptrain.launch.stages import build_plan, write_run_files

    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text('#!/bin/bash\nenv | grep ^SBATCH_ | sort >> "$CALLS"\necho 101\n')
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(calls))
    for name, value in (
        ("SBATCH_PARTITION", "debug"),
        ("SBATCH_TIMELIMIT", "0:10:00"),
        ("SBATCH_NO_REQUEUE", "1"),
        ("SBATCH_ACCOUNT", "proj"),
    ):
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    args = ["cluster_type=slurm", "cluster.partition=batch", "+cluster.max_requeues=2"]
    args += ["training.trainer.accelerator=cpu", "cluster.gpus_per_node=null", "cluster.gres=null"]
    args += [f"base_results_dir={tmp_path}/r"]
    plan = build_plan(compose(args))
    write_run_files(plan, args)
    slurm.submit(plan)
    assert calls.read_text().splitlines() == ["SBATCH_ACCOUNT=proj"]  # no key sets --account: it applies
    assert slurm.sbatch_variables_notes(plan) == [
        "note  SBATCH_* variables set in this shell: left out of the sbatch calls, as sbatch would take"
        " them over the #SBATCH lines preflight checked (SBATCH_NO_REQUEUE over cluster.max_requeues;"
        " SBATCH_PARTITION over cluster.partition; SBATCH_TIMELIMIT over training.run.time_limit): set those"
        " keys to change them; SBATCH_ACCOUNT applies, as no key of this launch sets its option"
    ]


def test_sbatch_variables_clash_with_every_option_the_script_renders(tmp_path, monkeypatch):
    """Only a fixed table of SBATCH_* variables was left out: SBATCH_WCKEY and SBATCH_DISTRIBUTION
    overrode the --wckey and --distribution lines cluster.additional_parameters rendered, and
    SBATCH_CPUS_PER_GPU contradicted a rendered --cpus-per-task (sbatch refuses the two together),
    while the note said they applied as no key set their options. Every rendered option counts now."""
    from gptrain.launch.compose import compose
    from gptrain.launch.executors.slurm import sbatch_directives
    from gptrain.launch.sbatch_env import sbatch_environment, sbatch_variables_note
    from gptrain.launch.stages import build_plan

    monkeypatch.chdir(tmp_path)
    args = ["cluster_type=slurm", "training.trainer.accelerator=cpu", "cluster.gpus_per_node=null"]
    args += ["cluster.gres=null", f"base_results_dir={tmp_path}/r"]
    args += ["+cluster.additional_parameters={wckey: projA, distribution: block}"]
    plan = build_plan(compose(args))
    [job] = plan.jobs
    lines = sbatch_directives(job, plan.cluster)
    assert {"#SBATCH --wckey=projA", "#SBATCH --distribution=block"} <= set(lines)
    preparation = ["#SBATCH --job-name=prep", "#SBATCH --cpus-per-task=4"]  # data_preparation.workers=4
    environ = {"SBATCH_WCKEY": "other", "SBATCH_DISTRIBUTION": "cyclic", "SBATCH_CPUS_PER_GPU": "8"}
    environ |= {"SBATCH_HINT": "nomultithread", "PATH": "/bin"}
    kept = {"SBATCH_HINT": "nomultithread", "PATH": "/bin"}
    assert sbatch_environment(lines, environ) == kept | {"SBATCH_CPUS_PER_GPU": "8"}
    assert sbatch_environment(preparation, environ) == kept | {
        "SBATCH_WCKEY": "other",
        "SBATCH_DISTRIBUTION": "cyclic",
    }
    assert sbatch_variables_note([("training", lines), ("data_preparation", preparation)], environ) == (
        "note  SBATCH_* variables set in this shell: left out of the sbatch calls, as sbatch would take"
        " them over the #SBATCH lines preflight checked (SBATCH_CPUS_PER_GPU over"
        " cluster.cpus_per_task (data_preparation.workers for the data preparation); SBATCH_DISTRIBUTION over"
        " cluster.additional_parameters' --distribution; SBATCH_WCKEY over cluster.additional_parameters'"
        " --wckey): set those keys to change them; SBATCH_HINT applies, as no key of this launch sets its option"
    )


@pytest.mark.parametrize(
    ("line", "variable"),
    [
        ("#SBATCH --gpu-b=closest", "SBATCH_GPU_BIND"),  # an abbreviation sbatch reads as --gpu-bind
        ("#SBATCH --cluster=c2", "SBATCH_CLUSTERS"),  # --cluster is sbatch's other name of --clusters
        ("#SBATCH --cluster=c2", "SLURM_CLUSTERS"),  # sbatch reads it as -M too
        ("#SBATCH --hint=nomultithread", "SLURM_HINT"),  # and this as --hint
        ("#SBATCH --bb=capacity=1G", "SBATCH_BURST_BUFFER"),  # its option is --bb
        ("#SBATCH --segment=4", "SBATCH_SEGMENT_SIZE"),  # its option is --segment
        ("#SBATCH --verbose", "SBATCH_DEBUG"),  # -v
    ],
)
def test_sbatch_variables_are_matched_to_the_options_sbatch_reads(line, variable):
    """The variables were matched by their names against the rendered options' spelling: a
    variable whose option sbatch names otherwise (SBATCH_BURST_BUFFER sets --bb), one not named
    SBATCH_ (SLURM_HINT), or a line written as an abbreviation or an alias (`gpu_b`, `cluster` in
    cluster.additional_parameters) was not seen to clash, and sbatch took the variable over the line."""
    from gptrain.launch.sbatch_env import overriding_variables, rendered_options, sbatch_environment

    environ = {variable: "x", "PATH": "/bin"}
    assert list(overriding_variables(rendered_options([line]), environ)) == [variable]
    assert sbatch_environment(["#SBATCH --job-name=j", line], environ) == {"PATH": "/bin"}
    assert (
        sbatch_environment(["#SBATCH --job-name=j"], environ) == environ
    )  # no line of its option: it applies


def fake_slurm_bin(tmp_path, version: str) -> None:
    """sinfo with two idle CPU nodes and an sbatch whose --version says `version`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text(
        "#!/bin/sh\nprintf 'n0|debug*|2|(null)|idle|infinite\\nn1|debug*|2|(null)|idle|infinite\\n'\n"
    )
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && echo '{version}'\n")
    for tool in ("sinfo", "sbatch"):
        (bin_dir / tool).chmod(0o755)


@pytest.mark.parametrize(
    ("version", "refused"),
    [
        ("slurm-wlm 22.05.8", True),
        ("slurm 23.11.10", True),
        ("slurm 24.05.0", False),
        ("slurm 25.11.2", False),
    ],
)
def test_exclusive_topo_is_refused_where_sbatch_is_older_than_24_05(tmp_path, monkeypatch, version, refused):
    """`--exclusive=topo` came with Slurm 24.05 (NEWS: "Add --exclusive=topo for use with
    topology/block"); an older sbatch refuses the line ("Invalid --exclusive specification") only when
    the job is submitted, after every check had passed. Preflight asks sbatch for its version."""
    from gptrain.launch.compose import compose
    from gptrain.launch.executors.slurm import preflight_cluster
    from gptrain.launch.stages import build_plan

    fake_slurm_bin(tmp_path, version)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    args = ["cluster_type=slurm", "training.trainer.accelerator=cpu", "cluster.gpus_per_node=null"]
    args += ["cluster.gres=null", "training.trainer.devices=1", "training.trainer.num_nodes=1"]
    args += [f"base_results_dir={tmp_path}/r"]
    plan = build_plan(compose([*args, "cluster.exclusive=topo"]))
    if not refused:
        assert preflight_cluster(plan)[0].startswith("ok  training: partition debug")
        return
    with pytest.raises(LaunchError) as error:
        preflight_cluster(plan)
    given = version.split()[-1]
    assert str(error.value) == (
        f"cluster.exclusive=topo: this sbatch is Slurm {given}, which refuses --exclusive=topo (Slurm 24.05"
        " first reads it); give cluster.exclusive=true (whole nodes) or user"
    )
    assert preflight_cluster(build_plan(compose([*args, "cluster.exclusive=user"])))[0].startswith("ok  ")


def test_an_sbatch_that_does_not_answer_its_version_leaves_the_mode_to_sbatch(tmp_path, monkeypatch):
    """A hung `sbatch --version` (a controller-side plugin, a wrapper waiting on a lock) is cut off
    at the timeout and read as no version: --exclusive=topo is then left to sbatch, not a traceback
    or a launch that waits on it."""
    import time

    from gptrain.launch.preflight import check_exclusive_mode, sbatch_version

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\nexec sleep 30\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    started = time.monotonic()
    assert sbatch_version(timeout=0.5) is None
    assert time.monotonic() - started < 10  # cut off, not waited out (30 s)
    check_exclusive_mode({"exclusive": "topo"}, None)  # an unknown version: left to sbatch


def test_preflight_checks_the_partition_sbatch_partition_picks_where_no_key_names_one(monkeypatch):
    """With cluster.partition unset, SBATCH_PARTITION in the shell chooses the job's partition (the
    script names none), yet preflight checked the cluster's default partition."""
    cluster = [*nodes(count=1), *[Node(f"g{i}", "big", False, 8, 0, "idle") for i in range(4)]]
    job = Job("training", "r", "r", None, [], nodes=3, tasks_per_node=2)
    monkeypatch.setenv("SBATCH_PARTITION", "big")
    assert check_cluster(job, {}, cluster).startswith("ok  training: partition big, 3/4")
    assert "partition debug" in check_cluster(Job("t", "r", "r", None, []), {"partition": "debug"}, cluster)
    monkeypatch.setenv("SBATCH_PARTITION", "bgi")
    with pytest.raises(
        LaunchError, match=r"partition 'bgi' does not exist \(SBATCH_PARTITION in this shell\)"
    ):
        check_cluster(job, {}, cluster)


@pytest.mark.parametrize(
    ("time_limit", "says"),
    [
        ("2-00:01:00", "training.run.time_limit=2-00:01:00 is longer than partition 'debug' allows"),
        (
            "2880:01",
            "training.run.time_limit=2880:01 is longer than",
        ),  # MM:SS: Slurm rounds up to 2881 minutes
        (0, "training.run.time_limit=0 asks for no time limit, but partition 'debug' allows"),
        ("UNLIMITED", "training.run.time_limit=UNLIMITED asks for no time limit, but"),
    ],
)
def test_a_time_limit_over_the_partitions_would_pend_for_ever_and_is_refused(time_limit, says):
    """sbatch accepts it (EnforcePartLimits=NO, Slurm's default) and the job waits with
    Reason=PartitionTimeLimit until an administrator raises the limit; `time_limit: 0` too."""
    limited = [Node(f"n{i}", "debug", True, 2, 0, "idle", "2-00:00:00") for i in range(2)]
    job = Job("training", "r", "r", None, [], nodes=2, time_limit=time_limit)
    with pytest.raises(LaunchError) as error:
        check_cluster(job, {}, limited)
    assert str(error.value).startswith(says) and str(error.value).endswith(
        "allows (2-00:00:00, its time limit in sinfo): Slurm would leave the job pending for ever"
        " (PartitionTimeLimit); give at most 2-00:00:00, or pick another cluster.partition"
    )


@pytest.mark.parametrize(
    ("time_limit", "max_time", "cluster"),
    [
        ("2-00:00:00", "2-00:00:00", {}),  # exactly the limit
        ("2880:00", "2-00:00:00", {}),
        (None, "1:00:00", {}),  # no --time: the partition's DefaultTime
        (0, "infinite", {}),
        ("3-00:00:00", "n/a", {}),  # a form the check does not read: left to Slurm
        ("3-00:00:00", "2-00:00:00", {"qos": "long"}),  # a QOS may lift the partition's limit
        ("3-00:00:00", None, {}),  # an sinfo line without the field
    ],
)
def test_a_time_limit_the_partition_allows_passes(time_limit, max_time, cluster):
    limited = [Node(f"n{i}", "debug", True, 2, 0, "idle", max_time) for i in range(2)]
    job = Job("training", "r", "r", None, [], nodes=2, time_limit=time_limit)
    assert check_cluster(job, cluster, limited).startswith("ok  training: partition debug, 2/2 nodes")


@pytest.mark.parametrize("key", ["time_min", "time-min", "time_mi"])
def test_a_time_limit_over_the_partitions_passes_with_a_time_min_it_allows(key):
    """With --time-min Slurm starts the job with a limit down to it (backfill): a time_limit over
    MaxTime was refused though the job runs, cut to at most MaxTime."""
    limited = [Node(f"n{i}", "debug", True, 2, 0, "idle", "2-00:00:00") for i in range(2)]
    job = Job("training", "r", "r", None, [], nodes=2, time_limit="3-00:00:00")
    cluster = {"additional_parameters": {key: "2-00:00:00"}}
    assert check_cluster(job, cluster, limited).startswith("ok  training: partition debug, 2/2 nodes")


@pytest.mark.parametrize(
    ("time_min", "says"),
    [
        ("2-00:01:00", "time_min=2-00:01:00 is longer than partition 'debug' allows"),
        (0, "time_min=0 asks for no time limit, but partition 'debug' allows"),  # sbatch: 0 is INFINITE
    ],
)
def test_a_time_min_over_the_partitions_time_limit_is_refused_naming_it(time_min, says):
    """Slurm refuses a --time-min over the partition's MaxTime at submission (whatever time_limit)."""
    limited = [Node(f"n{i}", "debug", True, 2, 0, "idle", "2-00:00:00") for i in range(2)]
    job = Job("training", "r", "r", None, [], nodes=2, time_limit="3-00:00:00")
    with pytest.raises(LaunchError) as error:
        check_cluster(job, {"additional_parameters": {"time_min": time_min}}, limited)
    assert str(error.value) == (
        f"cluster.additional_parameters.{says} (2-00:00:00, its time limit in sinfo): Slurm would refuse"
        " the job when it is submitted (a --time-min over the partition's MaxTime); give at most"
        " 2-00:00:00, or pick another cluster.partition"
    )


def test_the_partitions_time_limit_is_read_from_sinfo(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sinfo = (
        "#!/bin/bash\n[ \"$4\" = '%N|%P|%c|%G|%T|%l' ] || exit 3\necho 'n1|gpu*|64|gpu:8|idle|2-00:00:00'\n"
    )
    (bin_dir / "sinfo").write_text(sinfo)
    (bin_dir / "sinfo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert query_nodes() == [Node("n1", "gpu", True, 64, 8, "idle", "2-00:00:00")]


@pytest.mark.parametrize(
    ("extra", "noted"),
    [
        ("cluster.additional_parameters.gpus_per_socket=2", False),
        ("cluster.additional_parameters.tres_per_task=gres/gpu:1", False),
        ("cluster.additional_parameters.tres_per_task=cpu:2", True),
        ("cluster.additional_parameters.comment=gpu", True),
        # options about the GPUs a job has, which ask for none: the note was left out for them
        ("cluster.additional_parameters.gpu_bind=closest", True),
        ("cluster.additional_parameters.gpu_freq=high", True),
        ("cluster.additional_parameters.cpus_per_gpu=4", True),
    ],
)
def test_gpus_asked_through_additional_parameters_are_not_said_to_be_none(tmp_path, extra, noted):
    """A GPU request only in additional_parameters (gpus_per_socket, tres_per_task gres/gpu) was said
    to ask Slurm for no GPU, advising a second request."""
    from gptrain.launch.compose import compose
    from gptrain.launch.launcher import no_gpus_asked_notes
    from gptrain.launch.stages import build_plan

    args = [
        "cluster_type=slurm",
        f"base_results_dir={tmp_path}",
        "cluster.gpus_per_node=null",
        "cluster.gres=null",
    ]
    plan = build_plan(compose([*args, "training.trainer.devices=4", extra]))
    assert bool(no_gpus_asked_notes(plan)) is noted


@pytest.mark.parametrize(
    "job_id", ["", "0", 0, -3, "00", "12a", " 12", "1_2", "local-", "local-0", "local-x", 1.5]
)
def test_a_submitted_record_whose_job_id_is_no_slurm_or_local_id_is_skipped(tmp_path, monkeypatch, job_id):
    """A `submitted` line with job id "" or 0 counted as naming a job: `gptrain status` ran
    `scontrol show job ""`, which lists every job on the controller, and `cancel` ran `scancel ""`.
    Only what gptrain writes names a job: sbatch's positive id, or local-<pid>."""
    asked = []
    monkeypatch.setattr(slurm_queries, "run_command", lambda argv, *a, **k: asked.append(argv))
    monkeypatch.setattr(cancelling, "scancel", lambda job_id: asked.append(["scancel", job_id]))
    with open(tmp_path / "launcher.log", "w") as handle:
        handle.write(json.dumps({"event": "submitted", "stage": "training", "job_id": job_id}) + "\n")
    assert read_records(tmp_path) == []
    assert status.status_lines(tmp_path)[0].endswith("nothing launched yet")
    assert cancelling.cancel(tmp_path) == ["nothing to cancel"]
    assert asked == []


@pytest.mark.parametrize("job_id", ["7", 7, "4294967294"])
def test_a_submitted_record_with_a_positive_slurm_job_id_is_read(tmp_path, job_id):
    append_record(tmp_path, "submitted", stage="training", executor="slurm", job_id=job_id)
    assert [r["job_id"] for r in read_records(tmp_path)] == [job_id]


@pytest.mark.parametrize(
    "fields",
    [
        {"executor": "local", "job_id": "local-5"},  # no pid
        *(
            {"executor": "local", "job_id": "local-5", "pid": pid}
            for pid in ["x", "5", True, 0, -1, None, 5.0]
        ),
        {"executor": "local", "job_id": "local-5", "pid": 5, "array": "x"},
    ],
)
@pytest.mark.parametrize("command", ["status", "cancel"])
def test_a_submitted_record_with_no_usable_pid_or_array_count_is_skipped(
    tmp_path, capsys, monkeypatch, fields, command
):
    """A local record without a pid was a KeyError in `gptrain status` and `cancel`: gptrain writes a
    positive int; another is no record (a Slurm record's array count: see the test below)."""
    from gptrain.cli import main

    never = lambda *args, **kwargs: pytest.fail(f"asked Slurm {args}")  # noqa: E731
    monkeypatch.setattr(slurm_queries, "run_command", never)
    monkeypatch.setattr(cancelling, "scancel", never)

    with open(tmp_path / "launcher.log", "w") as handle:
        handle.write(json.dumps({"event": "submitted", "stage": "training", "log": "x", **fields}) + "\n")
    assert read_records(tmp_path) == []
    assert main([command, str(tmp_path)]) == 0
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("array", ["x", "4", True, 0, -2, 2.5, [2]])
def test_a_slurm_record_whose_array_count_is_no_count_is_kept_with_its_count_unknown(
    tmp_path, capsys, monkeypatch, array
):
    """A `submitted` record with sbatch's job id but `"array": "x"` (hand-edited) was skipped:
    `gptrain status` said "nothing launched yet" and `cancel` "nothing to cancel", the job running
    on. It is kept, its count unknown: Slurm is asked about it, cancel cancels it, status says so,
    and one task's finished log no longer says the whole array ended."""
    from gptrain.cli import main
    from gptrain.launch.log_endings import ended_by_log, ended_for_good

    log = tmp_path / "log-r_5_0.out"
    log.write_text("gptrain: job 5 on n1, stage training\ngptrain: step finished with exit code 0\n")
    fields = {
        "stage": "training",
        "executor": "slurm",
        "job_id": "5",
        "log": str(tmp_path / "log-r_%A_%a.out"),
    }
    with open(tmp_path / "launcher.log", "w") as handle:
        handle.write(json.dumps({"event": "submitted", **fields, "array": array}) + "\n")
    scontrol = "JobId=5 JobName=r\n   JobState=RUNNING Reason=None ExitCode=0:0\n"
    asked = []

    def run_command(command, timeout=15.0):
        asked.append(command)
        return subprocess.CompletedProcess(command, 0, scontrol if command[0] == "scontrol" else "", "")

    monkeypatch.setattr(slurm_queries, "run_command", run_command)
    (record,) = read_records(tmp_path)
    assert record["array"] is None and record["array_unread"] == array
    assert main(["status", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "training  job 5  RUNNING" in out and f"array task count as {array!r}: its logs cannot say" in out
    assert main(["cancel", str(tmp_path)]) == 0
    assert ["scancel", "5"] in [list(c[:2]) for c in asked]
    assert ended_by_log(record) is None and ended_for_good(record) is False
    assert ended_by_log({**fields, "array": 1}).state == "COMPLETED"


@pytest.mark.parametrize(
    "fields", [{"executor": "local", "job_id": "local-5", "pid": 5}, {"job_id": "5", "array": 4}]
)
def test_a_submitted_record_with_a_positive_pid_or_array_count_is_read(tmp_path, fields):
    append_record(tmp_path, "submitted", stage="training", **fields)
    assert read_records(tmp_path)[0] == {
        "time": read_records(tmp_path)[0]["time"],
        "event": "submitted",
        "stage": "training",
        **fields,
    }
