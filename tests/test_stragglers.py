"""Stragglers (issue 33, 2): a rank whose step rate stays 1.5x under its peers' median for
MLClusterConfig.straggler_after is named in the job's record, the jobs table, the monitor
and /metrics. The rule on its own (a clock of our own), then a real 3-rank local job whose
rank 2 sleeps longer per step."""

from __future__ import annotations

import json
import textwrap

import pytest
from helpers import wait_for

from jupyterlab_mlcluster.jobs.forensics.straggler import StragglerWatch
from jupyterlab_mlcluster.jobs.model import JobSpec
from jupyterlab_mlcluster.kernel.job_html import message_html
from jupyterlab_mlcluster.presentation import format_jobs_table
from jupyterlab_mlcluster.runtime.payload import Payload

START = 180  # cold ranks on a busy 2-core machine


def _feed(watch: StragglerWatch, rates: dict[int, float], until: float, t0: float = 0.0):
    """Each rank reports its step every 0.5 s from t0 to `until`, at its rate."""
    t = t0
    while t <= until:
        for rank, rate in rates.items():
            watch.step(rank, rate * t, now=t)
        t += 0.5


def test_a_slow_rank_is_named_once_a_whole_window_shows_it():
    watch = StragglerWatch(after=30.0)
    _feed(watch, {0: 4.0, 1: 4.0, 2: 1.0, 3: 4.1}, until=29.0)
    assert watch.check(now=29.0) is None  # not a whole window yet: no verdict
    _feed(watch, {0: 4.0, 1: 4.0, 2: 1.0, 3: 4.1}, until=40.0, t0=29.5)
    slow, median = watch.check(now=40.0)
    assert list(slow) == [2] and slow[2] == pytest.approx(1.0, rel=0.05)
    assert median == pytest.approx(4.0, rel=0.05)
    assert watch.check(now=40.0) is None  # unchanged: nothing to write


def test_a_rank_within_the_factor_is_not_named_and_a_recovered_one_is_cleared():
    watch = StragglerWatch(after=10.0)
    _feed(watch, {0: 3.0, 1: 3.0, 2: 2.2}, until=20.0)  # 3 / 2.2 < 1.5
    assert watch.check(now=20.0) is None and watch.flagged == ()
    # Rank 2 stops advancing: 0 steps/s over the next window.
    for t in (21.0, 26.0, 31.0):
        watch.step(0, 3.0 * t, now=t)
        watch.step(1, 3.0 * t, now=t)
        watch.step(2, 2.2 * 20.0, now=t)
    slow, _ = watch.check(now=31.0)
    assert slow == {2: 0.0}
    # It catches up (well above its peers over the window): cleared.
    for t in (36.0, 41.0):
        watch.step(0, 3.0 * t, now=t)
        watch.step(1, 3.0 * t, now=t)
        watch.step(2, 44.0 + 6.0 * (t - 31.0), now=t)
    assert watch.check(now=41.0) == ({}, pytest.approx(3.0))


def test_a_step_going_back_or_a_rank_ending_restarts_its_history():
    watch = StragglerWatch(after=5.0)
    _feed(watch, {0: 2.0, 1: 0.5}, until=10.0)
    assert list(watch.check(now=10.0)[0]) == [1]
    watch.step(1, 0.0, now=10.5)  # a new bar: its history starts again, no verdict yet
    assert watch.check(now=10.5) == ({}, 0.0)
    watch.forget(1)
    assert watch.rates(now=10.0) == {0: pytest.approx(2.0)}
    assert watch.stragglers(now=10.0) == ({}, 0.0)  # one rank has no peers
    assert not StragglerWatch(after=0).enabled


SLOW_RANK = textwrap.dedent(
    """\
    import os, time
    import jupyterlab_mlcluster as mlc

    rank = int(os.environ["RANK"])
    pause = 0.6 if rank == 2 else 0.1
    print("ready", flush=True)
    for step in range(100000):
        mlc.progress(step, desc="train")
        time.sleep(pause)
    """
)


def test_a_real_job_names_its_slow_rank_and_not_the_others(service, tmp_path, store_dir):
    """Ranks 0, 1, 3 step every 0.1 s, rank 2 every 0.6 s: rank 2 is named, live, in the
    record (REST's shape), the jobs table, the monitor and /metrics; the others never."""
    config_dir = tmp_path / "jupyter-config"
    config_dir.mkdir(exist_ok=True)
    (config_dir / "jupyter_mlcluster_config.json").write_text(
        json.dumps({"MLClusterConfig": {"straggler_after": 3}})
    )
    record = service.submit(
        JobSpec.from_options({"workers": 4, "framework": "none"}),
        Payload(kind="code", source=SLOW_RANK),
    )

    def named():
        r = service.get(record.id)
        assert not r.final, (r.state, r.error)
        return r if r.straggler else None

    job = wait_for(named, timeout=START, message="the straggler named")
    view = job.to_json()["straggler"]
    assert view["ranks"] == [2], view
    assert view["since"] and view["median"] > 3 * view["rates"]["2"] > 0
    assert "STRAGGLER rank 2 (" in format_jobs_table([job])
    assert "STRAGGLER rank 2" in message_html(job)

    from jupyterlab_mlcluster.server.metrics import build_metrics

    families = {f.name: f for f in build_metrics([job], None, now=job.updated)}
    assert [s.value for s in families["mlcluster_straggling_jobs"].samples] == [1]
    [sample] = families["mlcluster_job_straggler_ranks"].samples
    assert sample.value == 1 and sample.labels["job"] == job.id

    # It stays named (and the others stay unnamed) while the job runs on.
    seen = []

    def a_few_more_checks():
        seen.append(service.get(record.id).straggler["ranks"])
        return len(seen) >= 5

    wait_for(a_few_more_checks, timeout=30, interval=1.0, message="later checks")
    assert all(ranks == [2] for ranks in seen), seen
    lines, _ = service.logs(record.id)
    said = [line["line"] for line in lines if line["stream"] == "system"]
    assert any("rank 2 straggling:" in s for s in said), said
    service.cancel(record.id)
