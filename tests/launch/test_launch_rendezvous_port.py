"""The rendezvous port of a Slurm job: chosen once in the batch script, on the first node.

It was `20000 + SLURM_JOB_ID % 20000`, whatever held that port: two jobs sharing a node whose
ids differ by 20000 (or any process listening there, or an outgoing connection given it from
the kernel's ephemeral range 32768-60999) made rank 0 fail with EADDRINUSE after the queue wait.
The script's lines run here under bash with the /proc files they read swapped for the test's
own, and once as rendered, against a socket this test holds open on the job's port.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from gptrain.launch.compose import compose
from gptrain.launch.rendezvous import MASTER_LINES, RANK_WRAPPER
from gptrain.launch.stages import build_plan, write_run_files
from gptrain.utils.ports import PORT_LOW, PORT_SPAN

SCONTROL = 'case "$1 $2" in "show hostnames") echo n1 ;; "show node") echo "NodeAddr=10.0.0.7" ;; esac\n'


def stub(path: Path, text: str) -> None:
    path.write_text("#!/bin/bash\n" + text)
    path.chmod(0o755)


@pytest.fixture
def bin_dir(tmp_path) -> Path:
    path = tmp_path / "bin"
    path.mkdir()
    stub(path / "scontrol", SCONTROL)
    return path


def proc_tcp(ports: list[int], six: bool = False) -> str:
    """/proc/net/tcp (or tcp6) as Linux writes it, one socket per port (local address)."""
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
    host = "00000000000000000000000000000000" if six else "0100007F"
    rows = [
        f"{i:4d}: {host}:{port:04X} {host}:0000 0A 00000000:00000000 00:00000000 0\n"
        for i, port in enumerate(ports)
    ]
    return head + "".join(rows)


def chosen_port(tmp_path: Path, bin_dir: Path, job_id: int, held: list[int], ephemeral: str | None) -> int:
    """MASTER_PORT as the script's lines set it, with `held` ports in use and `ephemeral` the
    kernel's ip_local_port_range (None: the file is missing)."""
    tcp, tcp6, ranges = tmp_path / "tcp", tmp_path / "tcp6", tmp_path / "range"
    tcp.write_text(proc_tcp(held[::2]))
    tcp6.write_text(proc_tcp(held[1::2], six=True))
    if ephemeral is not None:
        ranges.write_text(ephemeral + "\n")
    lines = MASTER_LINES.replace("/proc/net/tcp6", str(tcp6)).replace("/proc/net/tcp", str(tcp))
    lines = lines.replace("/proc/sys/net/ipv4/ip_local_port_range", str(ranges))
    assert lines != MASTER_LINES
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": str(job_id)}
    env["SLURM_JOB_NODELIST"] = "n1"
    script = "set -uo pipefail\n" + lines + '\nprintf %s "$MASTER_PORT"\n'
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return int(done.stdout)


def test_the_port_follows_the_job_id_where_it_is_free(tmp_path, bin_dir):
    for job_id in (42, 12767, 12768, 987654321):
        port = chosen_port(tmp_path, bin_dir, job_id, [], "32768\t60999")
        assert port == PORT_LOW + job_id % PORT_SPAN < 32768


def test_a_port_another_job_holds_on_the_node_is_passed_over(tmp_path, bin_dir):
    """Jobs 42 and 12810 (and 20042 before) map to one port: the second takes the next free one."""
    first = PORT_LOW + 42
    assert chosen_port(tmp_path, bin_dir, 42 + PORT_SPAN, [first], "32768 60999") == first + 1
    # held in either file (IPv4 or IPv6 sockets), the next ones too
    held = [first, first + 1, first + 2, first + 4]
    assert chosen_port(tmp_path, bin_dir, 42, held, "32768 60999") == first + 3
    # the end of the range wraps to its start
    last = PORT_LOW + PORT_SPAN - 1
    assert chosen_port(tmp_path, bin_dir, PORT_SPAN - 1, [last], "32768 60999") == PORT_LOW


def test_the_ephemeral_range_is_avoided_unless_it_covers_every_port(tmp_path, bin_dir):
    """Outgoing connections take ports from ip_local_port_range at any time: a site that widened
    it into ours has its ports passed over, unless nothing outside it is left."""
    assert chosen_port(tmp_path, bin_dir, 42, [], "20000 20100") == 20101
    assert chosen_port(tmp_path, bin_dir, 42, [], "1024 65535") == PORT_LOW + 42
    assert chosen_port(tmp_path, bin_dir, 42, [PORT_LOW + 42], "1024 65535") == PORT_LOW + 43
    assert chosen_port(tmp_path, bin_dir, 42, [], None) == PORT_LOW + 42  # no such file: no range


def free_job_port() -> tuple[socket.socket, int]:
    """A listening socket on a job's port (job id < PORT_SPAN, so the old formula gave it too)."""
    for job_id in range(4000, PORT_SPAN):
        sock = socket.socket()
        try:
            sock.bind(("0.0.0.0", PORT_LOW + job_id))
        except OSError:
            sock.close()
            continue
        sock.listen()
        return sock, job_id
    pytest.skip("no free port in the rendezvous range")


def test_the_rendered_script_gives_every_rank_a_port_no_socket_holds(tmp_path, bin_dir):
    stub(bin_dir / "srun", 'while [[ $1 == --* ]]; do shift; done\nexec "$@"\n')
    stub(bin_dir / "py", 'printf %s "$MASTER_ADDR $MASTER_PORT $RANK" > "$OUT"\n')
    args = [f"base_results_dir={tmp_path}", "cluster_type=slurm", f"python={bin_dir}/py"]
    [script] = write_run_files(build_plan(compose(args)), args)
    sock, job_id = free_job_port()
    with sock:
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path / "out")}
        env.update(SLURM_JOB_ID=str(job_id), SLURM_JOB_NODELIST="n1", SLURM_PROCID="0", SLURM_LOCALID="0")
        env.update(SLURM_NTASKS="1", SLURM_NTASKS_PER_NODE="1", SLURM_RESTART_COUNT="0")
        env.pop("SLURM_STEP_RESV_PORTS", None)
        done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        addr, port, rank = (tmp_path / "out").read_text().split()
        assert (addr, rank) == ("10.0.0.7", "0")
        assert int(port) != sock.getsockname()[1] and PORT_LOW <= int(port) < PORT_LOW + PORT_SPAN
        with socket.socket() as other:  # rank 0 can listen there (TCPStore sets SO_REUSEADDR too)
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            other.bind(("0.0.0.0", int(port)))


@pytest.mark.parametrize(
    ("reserved", "port"), [("12001-12004", "12001"), ("12003,12007", "12003"), ("", "777")]
)
def test_ports_slurm_reserved_for_the_step_are_used_by_every_rank(reserved, port):
    """srun --resv-ports (MpiParams=ports=...): the step's first reserved port, the same on every node."""
    env = {**os.environ, "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS": "2"}
    env.update(SLURM_NTASKS_PER_NODE="2", MASTER_PORT="777", SLURM_STEP_RESV_PORTS=reserved)
    command = f"{RANK_WRAPPER} bash -c 'printf %s \"$MASTER_PORT $RANK\"'"
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=30)
    assert done.stdout == f"{port} 1", done.stderr


def test_the_validation_stage_chooses_its_port_as_the_training_does(tmp_path):
    args = [f"base_results_dir={tmp_path}", "cluster_type=slurm", "stages=[validation,training]"]
    validation, training = (path.read_text() for path in write_run_files(build_plan(compose(args)), args))
    assert MASTER_LINES in validation and MASTER_LINES in training
    assert validation.index(MASTER_LINES) < validation.index("\nsrun ")


@pytest.mark.parametrize(
    ("env", "port"),
    [
        ({"SLURM_JOB_ID": "42"}, str(PORT_LOW + 42)),  # plain srun: derived from the job id
        ({"SLURM_JOB_ID": "42", "MASTER_PORT": "24001"}, "24001"),  # the batch script's choice
        ({"SLURM_JOB_ID": "42", "SLURM_STEP_RESV_PORTS": "12005-12006"}, "12005"),  # Slurm's reserved one
        ({"SLURM_JOB_ID": "42", "MASTER_PORT": "24001", "SLURM_STEP_RESV_PORTS": "12005"}, "24001"),
    ],
)
def test_gptrain_validate_under_srun_takes_the_same_port(monkeypatch, env, port):
    runtime = pytest.importorskip("gptrain.validate.runtime")  # torch
    for name in ("RANK", "MASTER_PORT", "SLURM_STEP_RESV_PORTS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.7")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    runtime.rendezvous_env()
    assert os.environ["MASTER_PORT"] == port


@pytest.mark.parametrize("stage", ["training", "validation"])
def test_a_rendezvous_env_vars_sets_is_kept(tmp_path, bin_dir, stage):
    """NeMo's jobs keep a MASTER_PORT (or MASTER_ADDR) of env_vars: Lightning reads it when set. The
    script overwrote both, so a port the site's firewall lets through, or the first node's
    InfiniBand name, was replaced by one the nodes could not reach."""
    stub(bin_dir / "srun", 'while [[ $1 == --* ]]; do shift; done\nexec "$@"\n')
    stub(bin_dir / "py", 'printf %s "$MASTER_ADDR $MASTER_PORT" > "$OUT"\n')
    args = [f"base_results_dir={tmp_path}", "cluster_type=slurm", f"python={bin_dir}/py"]
    args += [
        "stages=[validation,training]",
        "env_vars.MASTER_PORT=29400",
        "env_vars.MASTER_ADDR=$SLURMD_NODENAME-ib",
    ]
    scripts = dict(
        zip(("validation", "training"), write_run_files(build_plan(compose(args)), args), strict=True)
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path / "out")}
    env.update(
        SLURM_JOB_ID="42", SLURM_JOB_NODELIST="n1", SLURM_PROCID="0", SLURM_LOCALID="0", SLURMD_NODENAME="n1"
    )
    env.update(
        SLURM_NTASKS="1", SLURM_NTASKS_PER_NODE="1", SLURM_RESTART_COUNT="0", SLURM_STEP_RESV_PORTS="12001"
    )
    done = subprocess.run(["bash", str(scripts[stage])], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out").read_text() == "n1-ib 29400"
    # without them, the script's choice; Slurm's reserved port wins over it
    args = args[:-2]
    scripts = dict(
        zip(("validation", "training"), write_run_files(build_plan(compose(args)), args), strict=True)
    )
    done = subprocess.run(["bash", str(scripts[stage])], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out").read_text() == "10.0.0.7 12001"
