"""The API server fails under the two long-lived followers of the cluster: the Jupyter server's
Notebook watch (the sidebar's feed) and the notebook-controller (a real process). Each is cut
(connections refused, open watches reset) and then hung (nothing answered, open streams
stalled) for 10 s while a Notebook is created behind its back: it idles meanwhile (CPU, log
lines, requests), and catches up once the server is back. Each test prints its figures.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from jupyterlab_mlcluster.kubeconn import KubeConnection
from jupyterlab_mlcluster.server.notebook_feed import NotebookFeed
from jupyterlab_mlcluster.server.notebook_watch import NotebookWatch
from jupyterlab_mlcluster.server.notebooks import OWNER_LABEL
from notebook_controller.objects import LABEL_NOTEBOOK, notebook_resource
from tests.kube.controller_process import ControllerZygote
from tests.kube.controller_support import create_notebook, install_crds, owned

pytestmark = pytest.mark.slow

# Seconds the API server is cut, then hung: long enough for several rounds of backoff and
# reconnects (the supervisor's tests and bench/bench_api_faults.py hold the 20 s cuts).
OUTAGE = 10.0
# Once the server is back, a follower waits at most its backoff cap (kubeconn: 60 s) before
# it tries again; then the catch-up itself.
CATCH_UP = 90.0
ALICE = "alice@example.com"


def thread_cpu(native_ids: set[int]) -> float:
    """CPU seconds used so far by these threads of this process."""
    return sum(
        t.user_time + t.system_time for t in psutil.Process().threads() if t.id in native_ids
    )


def process_cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


class Records(logging.Handler):
    """Every log record of the process at INFO or above, whoever logs it (ours, the
    kubernetes client, urllib3)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records():
    handler = Records()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield handler
    root.removeHandler(handler)
    root.setLevel(level)


def notebook(name: str, namespace: str) -> dict[str, Any]:
    return notebook_resource(name, namespace, ALICE, labels={OWNER_LABEL: "x"})


def test_the_notebook_watch_idles_through_an_outage_and_catches_up(
    kube, kube_namespace, proxy, records
):
    install_crds(kube)
    kube.create(notebook("before", kube_namespace))
    seen: dict[str, dict[str, Any]] = {}
    feed = NotebookFeed(lambda owner, name, message: seen.__setitem__(name, message))
    watch = NotebookWatch(KubeConnection(kube_namespace), feed, watch_timeout=300)
    watch.start()
    try:
        kube.wait_for(lambda: "before" in seen, message="the first list")
        kube.wait_for(lambda: len(watch._threads) == 2, message="both followers")
        # ... and both listed: the events follower's first list imports the kubernetes
        # client's typed API (its pydantic models: some 1.5 s of CPU, once per process),
        # which is not what an outage costs.
        kube.wait_for(
            lambda: watch.notebooks.lists >= 1 and watch.events.lists >= 1,
            message="both followers' first lists",
        )
        threads = {t.native_id for t in watch._threads if t.native_id is not None}
        figures = []
        for fault in ("refuse", "hang"):
            name = f"during-{fault}"
            cpu_before = thread_cpu(threads)
            logged_before = len(records.records)
            requests_before = len(proxy.requests)
            started = time.monotonic()
            proxy.set_mode(fault)
            time.sleep(OUTAGE / 2)
            kube.create(notebook(name, kube_namespace))  # the watch cannot see this yet
            time.sleep(OUTAGE / 2)
            cut = time.monotonic() - started
            cpu = (thread_cpu(threads) - cpu_before) / cut
            logged = len(records.records) - logged_before
            attempts = len(proxy.requests) - requests_before
            proxy.set_mode("pass")
            back = time.monotonic()
            kube.wait_for(
                lambda name=name: name in seen,
                timeout=CATCH_UP,
                message=f"{name} in the feed after the {fault}",
            )
            figures.append(
                f"{fault} {cut:.0f}s: CPU {cpu:.1%} of a core, {logged} log lines, "
                f"{attempts} requests; caught up {time.monotonic() - back:.1f}s after"
            )
            assert cpu < 0.10, f"the watch used {cpu:.1%} of a core during the {fault}"
            assert logged <= 10, [r.getMessage()[:200] for r in records.records[-logged:]]
            assert attempts < 60, f"{attempts} requests during a {cut:.0f}s {fault}"
        # Lost: nothing. Both notebooks made in the dark are in the feed, and so is the first.
        assert {"before", "during-refuse", "during-hang"} <= set(seen)
        print(
            f"\n[faults] notebook watch, 2 faults injected ({proxy.faults} connections broken "
            f"by the proxy): {'; '.join(figures)}; lost: 0 of 3 notebooks"
        )
    finally:
        threading.Thread(target=watch.stop, daemon=True).start()


def test_the_controller_idles_through_an_outage_and_catches_up(
    kube, kube_namespace, proxy, tmp_path: Path
):
    install_crds(kube)
    log = tmp_path / "controller.log"
    zygote = ControllerZygote()  # started after `proxy`: its $KUBECONFIG is the proxied one
    try:
        pid = zygote.spawn(
            [
                f"--namespace={kube_namespace}",
                "--no-culling",
                "--ControllerConfig.mirror_events=False",
            ],
            log,
        )
        create_notebook(kube, kube_namespace, name="before", workspace=None)
        kube.wait_for(
            lambda: len(owned(kube, kube_namespace, "before")) == 4,
            timeout=60,
            message="the first notebook's objects",
        )
        time.sleep(2)  # let its watches settle
        figures = []
        for fault in ("refuse", "hang"):
            name = f"during-{fault}"
            cpu_before, size_before = process_cpu(pid), log.stat().st_size
            requests_before = len(proxy.requests)
            started = time.monotonic()
            proxy.set_mode(fault)
            time.sleep(OUTAGE / 2)
            create_notebook(kube, kube_namespace, name=name, workspace=None)
            time.sleep(OUTAGE / 2)
            cut = time.monotonic() - started
            cpu = (process_cpu(pid) - cpu_before) / cut
            growth = log.stat().st_size - size_before
            attempts = len(proxy.requests) - requests_before
            proxy.set_mode("pass")
            back = time.monotonic()
            try:
                kube.wait_for(
                    lambda name=name: len(owned(kube, kube_namespace, name)) == 4,
                    timeout=CATCH_UP,
                    message=f"{name}'s objects after the {fault}",
                )
            except TimeoutError as timeout:
                alive = "alive" if ControllerZygote.alive(pid) else "dead"
                raise AssertionError(
                    f"{timeout}; the controller is {alive}; its log:\n{log.read_text()[-12000:]}"
                ) from None
            figures.append(
                f"{fault} {cut:.0f}s: CPU {cpu:.1%} of a core, log +{growth / 1024:.1f} KiB, "
                f"{attempts} requests; reconciled {time.monotonic() - back:.1f}s after"
            )
            assert ControllerZygote.alive(pid), log.read_text()[-3000:]
            assert cpu < 0.10, f"the controller used {cpu:.1%} of a core during the {fault}"
            assert growth < 16 * 1024, log.read_text()[-3000:]
            assert attempts < 200, f"{attempts} requests during a {cut:.0f}s {fault}"
        duplicates = sum(
            max(0, len(kube.list("apps/v1", "StatefulSet", kube_namespace, label_selector=s)) - 1)
            for s in (f"{LABEL_NOTEBOOK}={n}" for n in ("before", "during-refuse", "during-hang"))
        )
        assert duplicates == 0
        print(
            f"\n[faults] controller, 2 faults injected ({proxy.faults} connections broken by the "
            f"proxy): {'; '.join(figures)}; lost: 0 of 3 notebooks, 0 duplicate objects"
        )
    finally:
        zygote.close()
