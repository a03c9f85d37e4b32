# First: importing the emulator fixtures points $KUBECONFIG at the emulator, and the kubernetes
# client reads that variable when it is imported (see tests/kube/README.md).
from tests.kube.fixtures import *  # noqa: I001

# The Kubernetes job backend's fixtures: k8s, player.
from tests.kube.jobs_fixtures import *

import pytest

from tests.faults.proxy import FaultProxy
from tests.kube.fixtures import write_kubeconfig


@pytest.fixture
def proxy(kube_cluster, tmp_path, monkeypatch):
    """The emulator behind a FaultProxy; this test's processes reach the cluster through it
    ($KUBECONFIG), the test's cluster side (`kube`, `player`) directly."""
    host, port = kube_cluster.url.removeprefix("http://").split(":")
    broken = FaultProxy((host, int(port)))
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "proxied.yaml", broken.url)))
    yield broken
    broken.stop()
