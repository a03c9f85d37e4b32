"""Two tracked jobs starting together on a new default local MLflow store (one sqlite
database in the job store): both supervisors would run MLflow's schema migrations at once,
and one failed midway; the first use is made under a lock, so both runs are recorded."""

from __future__ import annotations

import pytest
from helpers import wait_for

from jupyterlab_mlcluster.jobs.model import JobSpec
from jupyterlab_mlcluster.runtime.payload import Payload

pytest.importorskip("mlflow", reason="MLflow is in the test extra")


def test_two_jobs_meeting_a_new_local_store_both_record_their_runs(service, monkeypatch):
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "0")
    spec = JobSpec.from_options({"workers": 1, "framework": "none", "track": "mlflow"})
    jobs = [service.submit(spec, Payload(source=f"print({n})")).id for n in range(2)]

    def tracking_states():
        states = [(service.store.get_job(j).tracking or {}).get("state") for j in jobs]
        return states if all(s in ("finished", "unreachable", "failed") for s in states) else None

    states = wait_for(tracking_states, timeout=240, interval=0.5, message="both runs recorded")
    assert states == ["finished", "finished"], [service.store.get_job(j).tracking for j in jobs]
    from mlflow.tracking import MlflowClient

    uri = service.store.get_job(jobs[0]).tracking["uri"]
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert sorted(r.data.tags["mlcluster.job_id"] for r in runs) == sorted(jobs)
