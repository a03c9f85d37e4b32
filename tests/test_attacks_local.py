"""Attacks on local jobs (issue 13): each test names one, plays it against real rank
processes (warm pool and cold), and shows it refused."""

from __future__ import annotations

import pytest
from attacks import FORGED_LINES, FORGING_CELL, evil_result

from jupyterlab_mlcluster.jobs.model import JobSpec
from jupyterlab_mlcluster.runtime.payload import Payload


@pytest.fixture(autouse=True)
def _both_pool_modes(pool_mode):
    """Ranks forked from the warm pool and cold ones."""


def test_attack_forged_result_records_on_stdout(service, tmp_path):
    """Ranks print result and progress records on stdout (mid-line, with a made-up MAC,
    another job's key, genuine but mid-line, rank 1 posing as rank 0 with the job's key):
    the result is rank 0's own, nothing forged is loaded or shown as progress, and the
    forgeries stay in the log as the text they are."""
    mark = tmp_path / "unpickled"
    spec = JobSpec.from_options({"workers": 2})
    record = service.submit(spec, Payload(source=FORGING_CELL, push={"evil": evil_result(mark)}))
    final = service.wait(record.id, timeout=120)
    assert final.state == "succeeded", final.error
    assert service.result(record.id) == ("value", 42)
    assert not mark.exists()
    assert all((r.progress or {}).get("desc") != "forged" for r in final.ranks), final.ranks
    for rank, count in FORGED_LINES.items():
        lines, _ = service.logs(record.id, rank)
        assert sum("MLCLUSTER" in line["line"] for line in lines) == count, lines
