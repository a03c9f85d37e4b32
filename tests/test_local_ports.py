"""A job's ports are given to no other program before its ranks bind them (runtime/ports.py).

CI saw rank 0's TCPStore fail with EADDRINUSE on MASTER_PORT twice: the port had been found
free and closed, and another program on the machine bound it first. These tests make the
races certain instead of rare, in a network namespace of their own (`unshare -n`, so the
machine's sysctl is untouched) where the ephemeral range is a few ports: the test takes all
of them, both as the kernel gives them to connections and as a program that finds ports free
(jupyter_client choosing a kernel's ports) would, and still every job port binds."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jupyterlab_mlcluster.backends.slurm.script import batch_script
from jupyterlab_mlcluster.export.build import JobMaterial, build
from jupyterlab_mlcluster.jobs.model import JobSpec
from jupyterlab_mlcluster.jobs.record import JobRecord

# Runs inside the namespace (argv: the ephemeral range, a shell command printing the job's
# ports, how many times to run it, ports another program's servers listen on). Another program finds every ephemeral port free, then the job's
# ports are chosen, then the kernel's ephemeral ports are all taken by a listener on port 0
# and connections to it, then the other program binds what it found (SO_REUSEADDR, as zmq
# does), then rank 0 and its peers listen: TCPStore servers on the chosen ports, as
# init_process_group makes them (both of TCPStore's implementations).
PROBE = textwrap.dedent(
    """
    import datetime, errno, json, socket, subprocess, sys
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as f:
        f.write(sys.argv[1])
    low, high = map(int, sys.argv[1].split())
    servers = []  # another program's servers, already listening
    for port in filter(None, sys.argv[4].split(",")):
        servers.append(socket.create_server(("", int(port))))
    found_free = []
    for _ in range(int(sys.argv[5])):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        found_free.append(s)
    found_free_ports = [s.getsockname()[1] for s in found_free]
    for s in found_free:
        s.close()
    chosen = []
    for _ in range(int(sys.argv[3])):
        out = subprocess.run(["sh", "-c", sys.argv[2]], capture_output=True, text=True)
        if out.returncode != 0:
            chosen.append(out.stderr.strip().splitlines()[-1])
            break
        chosen += [int(p) for p in out.stdout.split()]
    handed_out, held = [], []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held.append(listener)
    handed_out.append(listener.getsockname()[1])
    while high - low < 64:  # a range small enough to use up
        client = socket.socket()
        try:
            client.connect(listener.getsockname())
        except OSError as e:
            assert e.errno == errno.EADDRNOTAVAIL, e  # the range is used up
            client.close()
            break
        held.append(client)
        handed_out.append(client.getsockname()[1])
    for s in held:
        s.close()
    for port in found_free_ports:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        s.listen()
        held.append(s)
    from torch.distributed import TCPStore
    bound = []
    for i, port in enumerate(p for p in chosen if isinstance(p, int)):
        store = TCPStore("localhost", port, 1, True, datetime.timedelta(seconds=10),
                         multi_tenant=True, use_libuv=i % 2 == 0)
        store.set("k", "v")
        bound.append(store.port)
    print(json.dumps({"chosen": chosen, "found_free": found_free_ports,
                      "handed_out": handed_out, "bound": bound}))
    """
)


def _local_job(_tmp: Path) -> str:
    """The local backend's supervisor: a JAX job's master and coordinator ports."""
    code = (
        "from jupyterlab_mlcluster.backends.local.launcher import job_ports;"
        "from jupyterlab_mlcluster.jobs.model import JobSpec;"
        "p = job_ports(JobSpec(workers=2, framework='jax')); print(p['master'], p['jax'])"
    )
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"


def _port_lines(script: str) -> str:
    """The lines of a batch script that choose its ports, each printing the port chosen."""
    chosen = [line for line in script.splitlines() if re.match(r"[A-Z_]+PORT=\$\(", line)]
    assert chosen, script
    return "; ".join(f"{line}; echo ${line.split('=', 1)[0]}" for line in chosen)


def _slurm_batch_script(_tmp: Path) -> str:
    """The Slurm backend's batch script, on the node where rank 0 runs."""
    spec = JobSpec(workers=2, framework="jax")
    return _port_lines(batch_script(python=sys.executable, attempt_dir="/tmp", spec=spec))


def _exported_sbatch(tmp: Path) -> str:
    """`mlcluster export --as sbatch`: the script and the port chooser shipped beside it, run
    from the export's directory (they need nothing of mlcluster's on the node)."""
    record = JobRecord(id="jportsexport", name="ports", spec=JobSpec(workers=2))
    material = JobMaterial(record, "", None, [], [], sys.executable, {}, "a test")
    files = build(material, "sbatch")
    for name, content in files.items():
        (tmp / name).write_bytes(content)
    # -S: no site-packages, so the chooser shipped must work with the standard library alone.
    python = f"{shlex.quote(sys.executable)} -S"
    lines = _port_lines(files["ports.sbatch"].decode()).replace('"$PYTHON"', python)
    return f"cd {shlex.quote(str(tmp))} && {lines}"


def _in_own_network(
    ephemeral: str, command: str, *, times: int = 1, servers: str = "", found_free: int = 0
) -> dict:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs util-linux's unshare and iproute2's ip to make a network namespace")
    proc = subprocess.run(
        [
            *("unshare", "-n", sys.executable, "-c", PROBE, ephemeral, command),
            *(str(times), servers, str(found_free)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    if proc.returncode != 0 and "unshare failed" in proc.stderr:
        pytest.skip(f"no network namespace for this user here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "choose",
    [_local_job, _slurm_batch_script, _exported_sbatch],
    ids=["local-supervisor", "slurm-batch-script", "exported-sbatch"],
)
def test_a_jobs_ports_are_outside_what_other_programs_are_given(choose, tmp_path):
    seen = _in_own_network("40000 40007", choose(tmp_path), found_free=2)
    chosen = seen["chosen"]
    assert chosen and len(set(chosen)) == len(chosen), seen
    # Not one of the ports the kernel gives out, so neither a connection nor a program that
    # found a port free can have it (a port found free was one of those, every time).
    assert all(10000 <= port < 40000 for port in chosen), seen
    assert len(seen["found_free"]) == 2 and len(seen["handed_out"]) == 8, seen
    assert set(seen["handed_out"]) | set(seen["found_free"]) <= set(range(40000, 40008)), seen
    # ... and rank 0 and its peers still listen on them, the other program on its own.
    assert seen["bound"] == chosen, seen


def test_choosers_never_share_a_port_and_say_when_none_is_left():
    """Three ports below the ephemeral range (10000-10002); another program's server has one.
    Two choices get the other two (each held from the next chooser), a third is refused with
    a clear error, and both chosen ports still bind."""
    choose = f"{shlex.quote(sys.executable)} -m jupyterlab_mlcluster.runtime.ports"
    seen = _in_own_network("10003 60999", choose, times=3, servers="10001")
    assert sorted(seen["chosen"][:2]) == [10000, 10002], seen
    assert "no free port for the job's ranks among 10000-10002" in seen["chosen"][2], seen
    assert seen["bound"] == seen["chosen"][:2], seen


def test_a_range_with_no_room_below_it_still_holds_the_port_from_connections():
    """An administrator's ephemeral range starting at 10000: the port comes from inside it,
    and connections are still not given it."""
    seen = _in_own_network("10000 10003", _local_job(Path()))
    chosen = seen["chosen"]
    assert len(chosen) == 2 and all(10000 <= p <= 10003 for p in chosen), seen
    assert set(seen["handed_out"]).isdisjoint(chosen) and len(seen["handed_out"]) == 2, seen
    assert seen["bound"] == chosen, seen
