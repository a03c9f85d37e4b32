"""Two notebook-controllers at once (real processes): one leads, the other takes over."""

from __future__ import annotations

import time
from pathlib import Path

from tests.kube.controller_process import ControllerZygote
from tests.kube.controller_support import create_notebook, install_crds, wait_owned
from tests.kube.helpers import Kube


def _holder(kube: Kube, namespace: str) -> str | None:
    lease = kube.find("coordination.k8s.io/v1", "Lease", "notebook-controller", namespace)
    return ((lease or {}).get("spec") or {}).get("holderIdentity")


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_two_controllers_one_reconciles_and_the_other_takes_over(
    kube: Kube, kube_namespace: str, tmp_path: Path
) -> None:
    """Attack/fault: a second controller (another replica, or one run from a kubeconfig)
    must not fight the first. Exactly one reconciles; SIGKILL it and the standby takes over
    within the lease duration (15 s by default), well under 30 s."""
    install_crds(kube)
    argv = [
        f"--namespace={kube_namespace}",
        "--no-culling",
        "--log-level=INFO",
        "--ControllerConfig.mirror_events=False",
        "--ControllerConfig.retry_delay=0.5",
    ]
    zygote = ControllerZygote()
    logs = {name: tmp_path / f"{name}.log" for name in ("a", "b")}
    try:
        a = zygote.spawn([*argv, "--ControllerConfig.leader_election_identity=ctl-a"], logs["a"])
        kube.wait_for(lambda: _holder(kube, kube_namespace) == "ctl-a", timeout=30)
        zygote.spawn([*argv, "--ControllerConfig.leader_election_identity=ctl-b"], logs["b"])
        kube.wait_for(lambda: "Standing by" in _read(logs["b"]), timeout=30)
        create_notebook(kube, kube_namespace, name="nb1", workspace=None)
        wait_owned(kube, kube_namespace, "nb1", count=4, timeout=30)
        time.sleep(3)  # the standby has had time to misbehave, and did not
        assert "Created StatefulSet" in _read(logs["a"])
        assert "Created" not in _read(logs["b"])
        assert _holder(kube, kube_namespace) == "ctl-a"

        zygote.kill(a)  # SIGKILL: the lease is not released, it must expire
        killed = time.monotonic()
        create_notebook(kube, kube_namespace, name="nb2", workspace=None)
        wait_owned(kube, kube_namespace, "nb2", count=4, timeout=30)
        took = time.monotonic() - killed
        assert took < 30, took
        assert _holder(kube, kube_namespace) == "ctl-b"
        assert "Created StatefulSet" in _read(logs["b"])
        lease = kube.get("coordination.k8s.io/v1", "Lease", "notebook-controller", kube_namespace)
        assert lease["spec"]["leaseTransitions"] == 1
        print(f"takeover after SIGKILL: {took:.1f} s")
    finally:
        zygote.close()
