"""An experiment's parameters are written at submit (params.json beside the job), so that a
tracker learns the pushed scalars without unpickling the payload."""

from __future__ import annotations

from helpers import wait_for

from jupyterlab_mlcluster.jobs.model import JobSpec
from jupyterlab_mlcluster.jobs.tracking.params import job_params
from jupyterlab_mlcluster.runtime.payload import Payload


def test_pushed_scalars_are_the_runs_params_and_nothing_else_is(service, monkeypatch):
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "0")
    push = {"lr": 0.1, "label": "base", "steps": 3, "weights": [1.0, 2.0], "bad": float("nan")}
    record = service.submit(
        JobSpec.from_options({"workers": 1, "framework": "none", "env": {"TOKEN": "s3cr3t"}}),
        Payload(source="pass", push=push),
    )
    params = job_params(service.store.job_dir(record.id), record.spec.to_dict())
    assert {k: v for k, v in params.items() if k.startswith("pushed.")} == {
        "pushed.lr": "0.1",
        "pushed.label": "base",
        "pushed.steps": "3",
    }
    assert params["env"] == "TOKEN" and "s3cr3t" not in str(params), "names, never values"
    wait_for(lambda: service.get(record.id).final, timeout=120, message="the job to end")
