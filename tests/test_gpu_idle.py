"""The idle-GPU rule (jobs/running/gpu_idle.py) over hand-made samples; the real path (ranks, store,
REST, /metrics) is tests/server/test_metrics.py."""

from __future__ import annotations

import json

import pytest

from jupyterlab_mlcluster.jobs.running.gpu_idle import IdleGpuWatch
from jupyterlab_mlcluster.runtime import nvml


def test_flagged_only_once_every_reporting_rank_idled_long_enough():
    watch = IdleGpuWatch(below_percent=5.0, after_seconds=10.0)
    # rank 2 has no GPU figure (no GPUs, or no NVML): it does not count either way
    cold = {"gpu_util": 1.0}
    assert watch.observe({0: cold, 1: {"gpu_util": 50.0}, 2: {"gpu_util": None}}, 100.0) is None
    assert watch.observe({0: cold, 1: {"gpu_util": 4.9}}, 103.0) is None
    assert watch.observe({0: cold}, 112.9) is None  # rank 1 quiet since 103 only
    assert watch.observe({1: {"gpu_util": 2}}, 113.0) == 103.0  # rank 0 kept its last word
    # A lying or broken report is no figure at all; a busy one clears the flag at once.
    for bad in (float("nan"), float("inf"), "3", True):
        assert watch.observe({0: {"gpu_util": bad}}, 114.0) == 103.0
    assert watch.observe({0: {"gpu_util": 5.0}}, 115.0) is None
    assert watch.observe({0: cold}, 120.0) is None  # a fresh quiet spell starts over
    assert watch.observe({}, 130.0) == 120.0


def test_off_and_nothing_to_judge():
    assert IdleGpuWatch(5.0, 0.0).observe({0: {"gpu_util": 0.0}}, 1e9) is None
    assert IdleGpuWatch(5.0, 1.0).observe({0: {"gpu_util": None}}, 1e9) is None


def test_the_test_nvml_file_answers_like_nvml(tmp_path, monkeypatch):
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"0": 3, "1": "busy"}))
    monkeypatch.setenv(nvml.TEST_FILE_ENV, str(path))
    lib = nvml.open_nvml()
    assert lib.nvmlDeviceGetUtilizationRates(lib.nvmlDeviceGetHandleByIndex(0)).gpu == 3
    with pytest.raises(TypeError):
        lib.nvmlDeviceGetUtilizationRates(1)
    with pytest.raises(KeyError):
        lib.nvmlDeviceGetMemoryInfo(2)
    # The local sampler skips what the source cannot answer, as for a vanished device.
    from jupyterlab_mlcluster.runtime.samplers import GpuSampler

    assert GpuSampler().sample([0, 1, 2], set()) == {"gpu_util": 3, "gpu_memory_bytes": 0}


def test_the_cell_monitor_shows_the_flag_and_the_tensorboard_button():
    from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
    from jupyterlab_mlcluster.jobs.record import JobRecord
    from jupyterlab_mlcluster.kernel.job_html import status_line, summary_html, title_html

    record = JobRecord(
        id="j1a2b3c4d5", name="idle", spec=JobSpec(workers=2, gpus_per_worker=1),
        state=JobState.RUNNING, started=1.0, gpu_idle_since=1_700_000_000.0,
    )  # fmt: skip
    assert "class='mlc-idle-gpus'" in title_html(record)
    assert "GPUs idle since" in status_line(record)
    assert "data-mlcluster-tensorboard='j1a2b3c4d5'" in summary_html(record)
    record.state = JobState.SUCCEEDED  # over: nothing is held any more
    assert "mlc-idle-gpus" not in title_html(record)
    assert "GPUs idle" not in status_line(record)
