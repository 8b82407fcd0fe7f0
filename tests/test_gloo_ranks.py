"""The tests' rendezvous ports: a probe of port 0 handed out an ephemeral port that any outgoing
connection could take before rank 0 listened (EADDRINUSE on a loaded machine)."""

from pathlib import Path

import pytest
from gloo_ranks import free_port, port_slice

from gptrain.utils.ports import PORT_LOW, PORT_SPAN


def test_each_xdist_worker_has_its_own_ports_apart_from_slurm_jobs_and_outgoing_connections():
    slices = [set(port_slice(f"gw{i}", "3")) for i in range(3)]
    assert all(len(s) >= 3000 for s in slices)
    assert not slices[0] & slices[1] and not slices[1] & slices[2] and not slices[0] & slices[2]
    every = set().union(*slices)
    assert not every & set(range(PORT_LOW, PORT_LOW + PORT_SPAN))  # gptrain's Slurm rendezvous
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if not ephemeral.exists():
        pytest.skip("no Linux ephemeral port range here")
    low, high = map(int, ephemeral.read_text().split())
    if low <= 10000:
        pytest.skip(f"this machine's ephemeral ports ({low}-{high}) cover every port below 20000")
    assert max(every) < low


def test_free_port_moves_on_and_skips_a_port_someone_listens_on():
    import socket

    first = free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", first + 1 if first + 1 in port_slice() else port_slice().start))
        held.listen()
        taken = held.getsockname()[1]
        got = [free_port() for _ in range(5)]
    assert len(set([first, *got])) == 6 and taken not in got
    assert all(port in port_slice() for port in [first, *got])
