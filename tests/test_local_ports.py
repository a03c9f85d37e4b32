"""A local job's ports stay its own until its ranks bind them.

CI once saw rank 0's TCPStore fail with EADDRINUSE: the supervisor had found the master port
free and closed it, and something else on the machine was handed it before rank 0 listened.
These tests make that race certain instead of rare: in a network namespace of their own
(`unshare -n`, so the machine's sysctl is untouched) the kernel has only four ephemeral
ports, and the test takes every one it will give out right after the job's port is chosen."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap

import pytest

from jupyterlab_mlcluster.backends.slurm.script import batch_script
from jupyterlab_mlcluster.export.build import JobMaterial, sbatch_text
from jupyterlab_mlcluster.jobs.model import JobSpec
from jupyterlab_mlcluster.jobs.record import JobRecord

# Runs inside the namespace: choose the job's ports as the code under test does (a shell
# command printing them), then exhaust the ephemeral range the way other programs would (a
# listener on port 0, connections to it), then be rank 0 and its peers: TCPStore servers on
# the chosen ports, as init_process_group makes them (both of TCPStore's implementations).
PROBE = textwrap.dedent(
    """
    import datetime, errno, json, socket, subprocess, sys
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as f:
        f.write("40000 40003")
    chosen = [int(p) for p in subprocess.run(
        ["sh", "-c", sys.argv[1]], check=True, capture_output=True, text=True
    ).stdout.split()]
    handed_out, held = [], []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held.append(listener)
    handed_out.append(listener.getsockname()[1])
    while True:
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
    from torch.distributed import TCPStore
    bound = []
    for i, port in enumerate(chosen):
        store = TCPStore("localhost", port, 1, True, datetime.timedelta(seconds=10),
                         multi_tenant=True, use_libuv=i % 2 == 0)
        store.set("k", "v")
        bound.append(store.port)
    print(json.dumps({"chosen": chosen, "handed_out": handed_out, "bound": bound}))
    """
)


def _local_job() -> str:
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


def _slurm_batch_script() -> str:
    """The Slurm backend's batch script, on the node where rank 0 runs."""
    spec = JobSpec(workers=2, framework="jax")
    return _port_lines(batch_script(python=sys.executable, attempt_dir="/tmp", spec=spec))


def _exported_sbatch() -> str:
    """`mlcluster export --target sbatch`: a script that needs nothing of ours on the node."""
    record = JobRecord(id="jportsexport", name="ports", spec=JobSpec(workers=2))
    material = JobMaterial(record, "", None, [], [], sys.executable, {}, "a test")
    return _port_lines(sbatch_text(material, "ports")).replace('"$PYTHON"', sys.executable)


def _in_own_network(command: str) -> dict:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs util-linux's unshare and iproute2's ip to make a network namespace")
    proc = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", PROBE, command],
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
def test_a_jobs_ports_are_handed_to_no_one_else_and_its_ranks_still_bind_them(choose):
    seen = _in_own_network(choose())
    chosen = seen["chosen"]
    # Four ports in the range: the job's, and the rest for everyone else. A port only found
    # free was handed out again (the listener got the master port, every time).
    assert len(set(chosen)) == len(chosen), seen
    assert set(seen["handed_out"]).isdisjoint(chosen), seen
    assert len(seen["handed_out"]) == 4 - len(chosen), seen
    # ... and rank 0 and its peers still listen on them.
    assert seen["bound"] == chosen, seen
