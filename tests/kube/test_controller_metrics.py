"""The notebook-controller's own /metrics, scraped while it runs against the emulator."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import free_port
from tests.kube.controller_support import create_notebook, wait_owned, wait_phase
from tests.kube.helpers import Kube


def scrape(port: int) -> dict[str, dict[tuple, float]] | None:
    """The served samples, or None while nothing listens yet (the controller is starting)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    except urllib.error.URLError:
        return None
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[key] = sample.value
    return samples


def test_notebooks_by_phase_and_reconciles_are_scraped(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    port = free_port()
    with controller(metrics_port=port, metrics_address="127.0.0.1"):
        before = kube.wait_for(lambda: scrape(port), 15)
        reconciled = before["mlcluster_controller_reconcile_seconds_count"][()]
        create_notebook(kube, kube_namespace, "nb-metrics")
        wait_phase(kube, kube_namespace, "nb-metrics", "starting")

        def counted():
            samples = scrape(port) or {}
            phases = samples.get("mlcluster_controller_notebooks", {})
            return samples if phases.get((("phase", "starting"),)) == 1 else None

        after = kube.wait_for(counted, 15)
        assert after["mlcluster_controller_reconcile_seconds_count"][()] > reconciled
        assert "mlcluster_controller_culled_total" in after
        assert "mlcluster_controller_reconcile_errors_total" in after
        # Only the controller's own series: not the process-wide default registry's.
        assert not any(name.startswith("python_gc") for name in after)
    # Stopped with the controller: nothing listens any more.
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_api_retries_are_counted_by_reason(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    port = free_port()
    path = f"/apis/apps/v1/namespaces/{kube_namespace}/statefulsets"
    with controller(metrics_port=port, metrics_address="127.0.0.1"):
        kube.wait_for(lambda: scrape(port), 15)
        kube.on_emulator(lambda e: e["post", path][:1] << 503)  # exactly one failure
        create_notebook(kube, kube_namespace, "nb-retried")
        wait_phase(kube, kube_namespace, "nb-retried", "starting")  # the retry went through

        def retried():
            retries = (scrape(port) or {}).get("mlcluster_controller_api_retries_total", {})
            return retries.get((("reason", "server_error"),))

        assert kube.wait_for(retried, 15) >= 1


def test_echoes_of_its_own_writes_are_counted_and_left_alone(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    """The watch event each of the controller's own creates sends back shows what it wrote:
    it is counted, not reconciled (issue 34: reconciling those four of a Notebook's six events
    was a tenth of the controller's CPU in a burst). A change by anyone else still is."""
    port = free_port()
    owned_events = "mlcluster_controller_owned_events_total"

    def counts() -> tuple[float, float]:
        samples = (scrape(port) or {}).get(owned_events, {})
        return (
            samples.get((("outcome", "own_write"),), 0.0),
            samples.get((("outcome", "reconciled"),), 0.0),
        )

    with controller(metrics_port=port, metrics_address="127.0.0.1"):
        kube.wait_for(lambda: scrape(port), 15)
        echoes, reconciled = counts()
        create_notebook(kube, kube_namespace, "nb-echo", workspace=None)
        wait_owned(kube, kube_namespace, "nb-echo", count=4)
        wait_phase(kube, kube_namespace, "nb-echo", "starting")
        kube.wait_for(lambda: counts()[0] >= echoes + 4, 15, message="four echoes counted")
        assert counts() == (echoes + 4, reconciled)
        kube.delete("v1", "Service", "nb-echo", kube_namespace)  # someone else's change
        kube.wait_for(
            lambda: counts() == (echoes + 5, reconciled + 1),
            15,
            message=f"the deletion reconciled, the new Service's echo counted: {counts()}",
        )
        assert kube.find("v1", "Service", "nb-echo", kube_namespace)
