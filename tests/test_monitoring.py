"""`mlcluster manifests --monitoring`: the ServiceMonitor against the Prometheus Operator's
published CRD, the Service against Kubernetes' schema, and a Grafana dashboard that fits
Grafana's published dashboard schema and refers only to series the code exports."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from helpers import run_cli

from jupyterlab_mlcluster.server.metrics import SERIES as SERVER_SERIES
from notebook_controller.config import ControllerConfig
from notebook_controller.metrics import SERIES as CONTROLLER_SERIES
from notebook_controller.monitoring import METRICS_PORT, dashboard
from tests.k8s_schemas import validate_manifest
from tests.kube.crds import _strict

UPSTREAM = Path(__file__).parent / "kube" / "upstream" / "prometheus-operator"
GRAFANA = Path(__file__).parent / "kube" / "upstream" / "grafana-foundation-sdk"


def service_monitor_schema() -> dict:
    crd = yaml.safe_load((UPSTREAM / "monitoring.coreos.com_servicemonitors.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))


def exported_series() -> set[str]:
    """Every series name a scrape can show: histograms' _bucket/_sum/_count, counters' _total."""
    names = set()
    for name, kind in [
        *((n, k) for n, (k, _) in SERVER_SERIES.items()),
        *CONTROLLER_SERIES.items(),
    ]:
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        elif kind == "counter":
            names.add(name if name.endswith("_total") else f"{name}_total")
        else:
            names.add(name)
    return names


def manifests(*args: str) -> list[dict]:
    proc = run_cli("manifests", "--namespace", "ml-system", *args)
    assert proc.returncode == 0, proc.stderr
    return [o for o in yaml.safe_load_all(proc.stdout) if o]


@pytest.mark.slow
def test_monitoring_manifests_fit_their_schemas_and_find_the_controller():
    objects = manifests("--monitoring")
    by_kind = {o["kind"]: o for o in objects if o["kind"] in ("ServiceMonitor", "ConfigMap")}
    monitor, board = by_kind["ServiceMonitor"], by_kind["ConfigMap"]
    jsonschema.Draft202012Validator(service_monitor_schema()).validate(monitor)
    (service,) = [
        o for o in objects if o["kind"] == "Service" and "metrics" in o["metadata"]["name"]
    ]
    for obj in (service, board):
        validate_manifest(obj)
    # The ServiceMonitor selects the Service, which selects the controller's pods, whose
    # controller is told to serve /metrics on the Service's port.
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    (deployment,) = [
        o
        for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["name"] == "notebook-controller"
    ]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--ControllerConfig.metrics_port={METRICS_PORT}" in args
    assert service["spec"]["ports"][0]["targetPort"] == METRICS_PORT
    assert ControllerConfig(metrics_port=METRICS_PORT).metrics_port == METRICS_PORT
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(board["data"]["mlcluster.json"]) == dashboard()
    # Without the flag: none of it, and the controller serves no /metrics.
    plain = manifests()
    assert not [o for o in plain if o["kind"] in ("ServiceMonitor", "ConfigMap")]
    assert not any("metrics_port" in a for o in plain if o["kind"] == "Deployment"
                   for a in o["spec"]["template"]["spec"]["containers"][0].get("args", []))  # fmt: skip


def grafana_dashboard_schema() -> dict:
    return json.loads((GRAFANA / "dashboard.jsonschema.json").read_text())


def test_the_dashboard_fits_grafanas_schema_and_refers_only_to_exported_series():
    board = dashboard()
    validator = jsonschema.Draft7Validator(grafana_dashboard_schema())
    validator.validate(board)
    # The schema is strict enough to catch a slip: an unknown field, a panel without its kind.
    assert not validator.is_valid({**board, "refreshEvery": "30s"})
    broken = copy.deepcopy(board)
    broken["panels"][0]["gridPos"] = {"h": "8"}
    assert not validator.is_valid(broken)
    exprs = [t["expr"] for panel in board["panels"] for t in panel["targets"]]
    used = {name for expr in exprs for name in re.findall(r"\bmlcluster_\w+", expr)}
    assert used, exprs
    assert used <= exported_series(), used - exported_series()
    # It shows what the issue asks for.
    for needed in ("mlcluster_jobs", "mlcluster_queue_length", "mlcluster_user_gpus_allocated",
                   "mlcluster_rank_gpu_utilization_percent", "mlcluster_controller_notebooks",
                   "mlcluster_idle_gpu_jobs"):  # fmt: skip
        assert needed in used
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
