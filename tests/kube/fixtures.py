"""pytest fixtures serving the realistic Kubernetes API emulator (see README.md).

Import this module from a ``conftest.py`` (``from tests.kube.fixtures import *``) before
anything imports ``kubernetes``: importing it writes the session kubeconfig and sets
``KUBECONFIG``, because the kubernetes client reads that variable at import time.
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from tests.helpers import free_port

from .emulator import EmulatorThread, RealisticKubernetes, kubeconfig
from .helpers import Kube


def write_kubeconfig(path: Path, url: str) -> Path:
    path.write_text(yaml.safe_dump(kubeconfig(url)))
    return path


_SESSION_DIR = Path(tempfile.mkdtemp(prefix="kube-emulator-"))
SESSION_PORT = free_port()
SESSION_KUBECONFIG = write_kubeconfig(
    _SESSION_DIR / "kubeconfig.yaml", f"http://127.0.0.1:{SESSION_PORT}"
)
os.environ["KUBECONFIG"] = str(SESSION_KUBECONFIG)
logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # one line per API request otherwise


@dataclass
class KubeCluster:
    """One running emulator: its URL, kubeconfig, helpers and the in-process server."""

    url: str
    kubeconfig: Path
    thread: EmulatorThread
    kube: Kube

    @property
    def emulator(self) -> RealisticKubernetes:
        assert self.thread.emulator is not None
        return self.thread.emulator

    def api_client(self) -> Any:
        import kubernetes

        return kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))


def start_cluster(kubeconfig_path: Path, port: int = 0, **options: Any) -> KubeCluster:
    thread = EmulatorThread(port=port, **options).start()
    write_kubeconfig(kubeconfig_path, thread.url)
    return KubeCluster(thread.url, kubeconfig_path, thread, Kube(thread.url, thread))


_SESSION_CLUSTER: list[KubeCluster] = []  # started once, whichever conftest asks first


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[KubeCluster]:
    """The session's emulator, at the address in $KUBECONFIG. Several test directories'
    conftests import these fixtures (each its own session fixture): they share the one
    emulator, stopped by the first that started it."""
    if _SESSION_CLUSTER:
        yield _SESSION_CLUSTER[0]
        return
    cluster = start_cluster(SESSION_KUBECONFIG, port=SESSION_PORT)
    _SESSION_CLUSTER.append(cluster)
    yield cluster
    _SESSION_CLUSTER.clear()
    cluster.thread.stop()


@pytest.fixture(scope="session")
def kube_url(kube_cluster: KubeCluster) -> str:
    return kube_cluster.url


@pytest.fixture(scope="session")
def kubeconfig_path(kube_cluster: KubeCluster) -> Path:
    return kube_cluster.kubeconfig


@pytest.fixture(scope="session")
def kube_api(kube_cluster: KubeCluster) -> Iterator[Any]:
    """A ready ``kubernetes.client.ApiClient`` for the session's emulator."""
    client = kube_cluster.api_client()
    yield client
    client.close()


@pytest_asyncio.fixture
async def kube_aio_api(kube_cluster: KubeCluster) -> AsyncIterator[Any]:
    """A ready ``kubernetes.aio.client.ApiClient`` (asyncio) for the session's emulator."""
    from kubernetes.aio import client, config

    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(kube_cluster.kubeconfig), client_configuration=configuration
    )
    async with client.ApiClient(configuration) as api:
        yield api


@pytest.fixture
def kube(kube_cluster: KubeCluster) -> Iterator[Kube]:
    """Helpers: generic REST, install_crd, set_pod_phase, run_statefulset, append_log, ..."""
    yield Kube(kube_cluster.url, kube_cluster.thread)
    kube_cluster.thread.call(lambda emulator: emulator.remove_reactions())  # faults a test added


@pytest.fixture
def kube_namespace(kube: Kube) -> Iterator[str]:
    """A fresh namespace, deleted (with everything in it) after the test."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    kube.create_namespace(name)
    yield name
    kube.delete("v1", "Namespace", name)


@pytest.fixture
def fresh_kube(tmp_path: Path) -> Iterator[Callable[..., KubeCluster]]:
    """Factory of pristine emulators (own port and kubeconfig), stopped after the test."""
    started: list[KubeCluster] = []

    def factory(**options: Any) -> KubeCluster:
        cluster = start_cluster(tmp_path / f"kubeconfig-{len(started)}.yaml", **options)
        started.append(cluster)
        return cluster

    yield factory
    for cluster in started:
        cluster.thread.stop()
