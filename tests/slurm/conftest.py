"""A real one-node Slurm (munged, slurmctld, slurmd) for the whole session (tests/slurm/cluster.py).

The backend reaches it as it reaches any cluster: through `SLURM_CONF`, which every process
started from here (CLI, kernel, server, supervisors, tasks) inherits.
"""

from __future__ import annotations

import json
import os

import pytest

# The in-process Jupyter server of tests/server (pytest-jupyter's fixtures, the extension on
# the test's store), for the REST test here: same fixtures, not a second copy.
from pytest_jupyter.jupyter_server import *

from tests.server.conftest import api, jp_server_config, mlc, mlc_config  # noqa: F401

from .cluster import SlurmCluster, missing


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    why = missing()
    if why:
        pytest.skip(f"no Slurm here: {why}")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    old = os.environ.get("SLURM_CONF")
    try:
        cluster.start()
        os.environ["SLURM_CONF"] = str(cluster.conf)
        yield cluster
    finally:
        cluster.stop()
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


@pytest.fixture
def slurm_store(slurm, store_dir, tmp_path, monkeypatch):
    """A fresh store whose jobs default to the slurm backend, with settings quick enough for
    tests; afterwards nothing of them may be left in Slurm's queue."""
    monkeypatch.setenv("MLCLUSTER_BACKEND", "slurm")
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "0")
    config_dir = tmp_path / "jupyter-config"
    config_dir.mkdir(exist_ok=True)
    (config_dir / "jupyter_mlcluster_config.json").write_text(
        json.dumps({"MLClusterConfig": {"slurm_poll_interval": 0.2, "kill_grace_period": 3.0}})
    )
    yield store_dir
    slurm.wait_empty()
