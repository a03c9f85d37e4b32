"""The `mlcluster` command's cluster-side commands (the job commands are in test_engine)."""

from __future__ import annotations

import yaml

from helpers import run_cli


def test_manifests_prints_everything_a_platform_team_applies():
    proc = run_cli("manifests", "--namespace", "ml-system", "--host", "ml.example.com")
    assert proc.returncode == 0, proc.stderr
    objects = [o for o in yaml.safe_load_all(proc.stdout) if o]
    kinds = {o["kind"] for o in objects}
    assert {
        "CustomResourceDefinition",
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Gateway",
    } <= kinds
    crd = next(o for o in objects if o["kind"] == "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "notebooks.mlcluster.io"
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["metadata"]["namespace"] == "ml-system"
    assert "controller" in " ".join(
        deployment["spec"]["template"]["spec"]["containers"][0].get("args", [])
        + deployment["spec"]["template"]["spec"]["containers"][0].get("command", [])
    )


def test_controller_and_manifests_take_their_own_options():
    assert "notebook-controller" in run_cli("controller", "--help").stdout
    bad = run_cli("manifests", "--nonsense=1")
    assert bad.returncode != 0
