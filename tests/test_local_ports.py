"""A local job's ports stay its own until its ranks bind them.

CI once saw rank 0's TCPStore fail with EADDRINUSE: the supervisor had found the master port
free and closed it, and something else on the machine was handed it before rank 0 listened.
These tests make that race certain instead of rare: in a network namespace of their own
(`unshare -n`, so the machine's sysctl is untouched) the kernel has only four ephemeral
ports, and the test takes every one it will give out right after the job's port is chosen."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

# Runs inside the namespace: choose the job's ports as the supervisor does, then exhaust the
# ephemeral range the way other programs would (a listener on port 0, connections to it),
# then be rank 0 and its peers: TCPStore servers on the chosen ports, as init_process_group
# makes them (both of TCPStore's server implementations).
PROBE = textwrap.dedent(
    """
    import errno, json, socket, subprocess
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as f:
        f.write("40000 40003")
    from jupyterlab_mlcluster.backends.local import launcher
    from jupyterlab_mlcluster.jobs.model import JobSpec
    spec = JobSpec(workers=2, framework="jax")
    ports = launcher.job_ports(spec)
    chosen = [ports["master"], ports["jax"]]
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
    import datetime
    from torch.distributed import TCPStore
    bound = []
    for port, libuv in zip(chosen, (True, False)):
        store = TCPStore("localhost", port, 1, True, datetime.timedelta(seconds=10),
                         multi_tenant=True, use_libuv=libuv)
        store.set("k", "v")
        bound.append(store.port)
    print(json.dumps({"chosen": chosen, "handed_out": handed_out, "bound": bound}))
    """
)


def _in_own_network() -> dict:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs util-linux's unshare and iproute2's ip to make a network namespace")
    proc = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    if proc.returncode != 0 and "unshare failed" in proc.stderr:
        pytest.skip(f"no network namespace for this user here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_jobs_ports_are_handed_to_no_one_else_and_its_ranks_still_bind_them():
    seen = _in_own_network()
    # Four ports in the range: the two the job holds, and two for everyone else. A port only
    # found free was handed out again (the listener got the master port, every time).
    assert len(set(seen["chosen"])) == 2
    assert set(seen["handed_out"]).isdisjoint(seen["chosen"]), seen
    assert len(seen["handed_out"]) == 2, seen
    # ... and rank 0 (libuv's server) and a peer (the older one) still listen on them.
    assert seen["bound"] == seen["chosen"], seen
