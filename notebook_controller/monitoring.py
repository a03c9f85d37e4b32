"""`mlcluster manifests --monitoring` (pure builders): a Service and a ServiceMonitor
(Prometheus Operator) for the controller's /metrics, and a Grafana dashboard in a ConfigMap
that Grafana's dashboard sidecar loads (label `grafana_dashboard: "1"`).

The dashboard reads the controller's series and the `mlcluster_*` series of the Jupyter
servers' own /metrics (scraped by however the platform scrapes its Jupyter servers)."""

from __future__ import annotations

import json
from typing import Any

from .manifests import CONTROLLER_NAME

METRICS_PORT = 9090
NAME = CONTROLLER_NAME


def _labels() -> dict[str, str]:
    return {
        "app.kubernetes.io/name": NAME,
        "app.kubernetes.io/part-of": "jupyterlab-mlcluster",
        "app.kubernetes.io/component": "metrics",
    }


def metrics_service(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{NAME}-metrics", "namespace": namespace, "labels": _labels()},
        "spec": {
            "selector": {"app.kubernetes.io/name": NAME},
            "ports": [{"name": "http-metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT}],
        },
    }


def service_monitor(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": NAME, "namespace": namespace, "labels": _labels()},
        "spec": {
            "selector": {"matchLabels": _labels()},
            "namespaceSelector": {"matchNames": [namespace]},
            "endpoints": [{"port": "http-metrics", "path": "/metrics", "interval": "30s"}],
        },
    }


def _panel(index: int, title: str, exprs: list[tuple[str, str]], kind: str = "timeseries"):
    return {
        "id": index + 1,
        "type": kind,
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(exprs)
        ],
    }


PANELS: list[tuple[str, list[tuple[str, str]]]] = [
    ("Jobs by state", [("sum by (state) (mlcluster_jobs)", "{{state}}")]),
    (
        "Queue",
        [
            ("sum by (backend) (mlcluster_queue_length)", "queued ({{backend}})"),
            ("max by (backend) (mlcluster_queue_oldest_wait_seconds)", "oldest wait s"),
        ],
    ),
    (
        "Admission latency (p50, p95)",
        [
            (
                (
                    "histogram_quantile(0.5, sum by (le) "
                    "(rate(mlcluster_job_admission_seconds_bucket[15m])))"
                ),
                "p50",
            ),
            (
                (
                    "histogram_quantile(0.95, sum by (le) "
                    "(rate(mlcluster_job_admission_seconds_bucket[15m])))"
                ),
                "p95",
            ),
        ],
    ),
    (
        "GPUs allocated / capacity",
        [
            ("sum(mlcluster_gpus_allocated)", "allocated"),
            ("sum(mlcluster_gpus_capacity)", "capacity"),
        ],
    ),
    ("GPUs allocated per user", [("sum by (owner) (mlcluster_user_gpus_allocated)", "{{owner}}")]),
    (
        "GPU utilisation per user (%)",
        [("avg by (owner) (mlcluster_rank_gpu_utilization_percent)", "{{owner}}")],
    ),
    (
        "Idle GPUs (running jobs flagged: every GPU nearly unused)",
        [
            ("sum by (backend) (mlcluster_idle_gpu_jobs)", "jobs ({{backend}})"),
            ("sum by (owner) (mlcluster_idle_gpus)", "GPUs of {{owner}}"),
        ],
    ),
    (
        "Job durations (p50) by final state",
        [
            (
                (
                    "histogram_quantile(0.5, sum by (le, state) "
                    "(rate(mlcluster_job_duration_seconds_bucket[1h])))"
                ),
                "{{state}}",
            )
        ],
    ),
    ("Restarts", [("sum(increase(mlcluster_job_restarts_total[1h]))", "restarts / h")]),
    ("Notebooks by phase", [("sum by (phase) (mlcluster_controller_notebooks)", "{{phase}}")]),
    (
        "Controller: reconciles, errors, culled",
        [
            ("sum(rate(mlcluster_controller_reconcile_seconds_count[5m]))", "reconciles/s"),
            ("sum(rate(mlcluster_controller_reconcile_errors_total[5m]))", "errors/s"),
            ("sum(increase(mlcluster_controller_culled_total[1h]))", "culled / h"),
        ],
    ),
]


def dashboard() -> dict[str, Any]:
    return {
        "title": "mlcluster: distributed jobs and notebooks",
        "uid": "mlcluster-overview",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "tags": ["mlcluster"],
        "annotations": {"list": []},  # required by Grafana's dashboard schema
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Prometheus",
                }
            ]
        },
        "panels": [_panel(i, title, exprs) for i, (title, exprs) in enumerate(PANELS)],
    }


def dashboard_configmap(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "mlcluster-grafana-dashboard",
            "namespace": namespace,
            "labels": {**_labels(), "grafana_dashboard": "1"},
        },
        "data": {"mlcluster.json": json.dumps(dashboard(), indent=1, sort_keys=True)},
    }


def monitoring_manifests(namespace: str) -> list[dict[str, Any]]:
    return [metrics_service(namespace), service_monitor(namespace), dashboard_configmap(namespace)]
