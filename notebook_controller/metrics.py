"""The notebook-controller's Prometheus figures, served on its own /metrics.

`ControllerConfig.metrics_port` (0: off) starts prometheus_client's HTTP server when the
controller starts. The figures live in their own registry (not the process-wide default), so
only the controller's series are served. Notebooks by phase are read from the controller's
kopf index at each scrape (memory only, no API call).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

REGISTRY = CollectorRegistry()

RECONCILES = Histogram(
    "mlcluster_controller_reconcile_seconds",
    "Time one reconcile of a Notebook took (create/update/resume/resync).",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "mlcluster_controller_reconcile_errors",
    "Reconciles that failed and will be retried.",
    registry=REGISTRY,
)
OWNED_EVENTS = Counter(
    "mlcluster_controller_owned_events",
    "Watch events of Notebooks' objects the controller acted on: 'reconciled' (put back in"
    " shape, the status refreshed) or 'own_write' (the echo of its own write: nothing to do).",
    ["outcome"],
    registry=REGISTRY,
)
CULLED = Counter(
    "mlcluster_controller_culled",
    "Notebooks stopped for being idle longer than cull_idle_time.",
    registry=REGISTRY,
)

API_RETRIES = Counter(
    "mlcluster_controller_api_retries",
    "Kubernetes API calls the controller tried again (kubeconn's backoff), by why.",
    ["reason"],
    registry=REGISTRY,
)


def count_api_retry(exc: BaseException) -> None:
    """kubeconn.call_async's `on_retry`: one retried API call, labelled by a few kinds only
    (bounded label values, whatever the error text)."""
    status = getattr(exc, "status", None)
    if status == 429:
        reason = "throttled"
    elif status == 409:
        reason = "conflict"
    elif isinstance(status, int) and status >= 500:
        reason = "server_error"
    else:
        reason = "unreachable"
    API_RETRIES.labels(reason=reason).inc()


# name -> kind, for the dashboard test (the series this module exports).
SERIES = {
    "mlcluster_controller_reconcile_seconds": "histogram",
    "mlcluster_controller_reconcile_errors_total": "counter",
    "mlcluster_controller_culled_total": "counter",
    "mlcluster_controller_owned_events_total": "counter",
    "mlcluster_controller_api_retries_total": "counter",
    "mlcluster_controller_notebooks": "gauge",
}


class NotebookPhases:
    """`mlcluster_controller_notebooks{phase}` from the live Notebooks the controller holds."""

    def __init__(self, notebooks: Callable[[], Iterable[dict[str, Any]]]) -> None:
        self.notebooks = notebooks

    def collect(self) -> list[Metric]:
        counts: dict[str, int] = {}
        for notebook in self.notebooks():
            phase = (notebook.get("status") or {}).get("phase") or "unknown"
            counts[phase] = counts.get(phase, 0) + 1
        family = GaugeMetricFamily(
            "mlcluster_controller_notebooks", "Notebooks by status phase.", labels=["phase"]
        )
        for phase, count in sorted(counts.items()):
            family.add_metric([phase], count)
        return [family]

    def describe(self) -> list[Metric]:
        return []


class MetricsServer:
    """The /metrics endpoint of one controller run (started in kopf's startup)."""

    def __init__(self) -> None:
        self._server: Any = None
        self._phases: NotebookPhases | None = None

    def start(self, port: int, address: str, notebooks: Callable[[], Iterable[dict]]) -> None:
        self._phases = NotebookPhases(notebooks)
        REGISTRY.register(self._phases)
        self._server, _ = start_http_server(port, addr=address, registry=REGISTRY)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._phases is not None:
            with contextlib.suppress(KeyError):
                REGISTRY.unregister(self._phases)
            self._phases = None
