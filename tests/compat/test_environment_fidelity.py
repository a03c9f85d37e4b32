"""A warm rank sees every variable, and every effect of a variable, that a fresh interpreter
would (issue 23's table): each row runs one probe under torchrun and under `mlcluster run`
(warm and cold ranks) in the same test, and what the ranks observed must agree. A variable a
warm rank cannot honour makes the job start cold, and its log says so once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import examples, run_cli

SCRIPTS = Path(__file__).parent / "scripts"


def probe_dir(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    shutil.copy(SCRIPTS / "env_probe.py", where / "env_probe.py")
    (where / "out").mkdir(exist_ok=True)
    return where


def seen(workdir: Path, tag: str) -> list[dict]:
    return [json.loads((workdir / "out" / f"{tag}-{rank}.json").read_text()) for rank in (0, 1)]


@pytest.fixture(scope="module")
def torchrun_seen(tmp_path_factory):
    """What torchrun's ranks observed, by the environment they were given: the reference
    does not depend on the pool mode a test is parametrized with, so torchrun runs once per
    environment in this module, not once per mode."""
    references: dict[tuple[tuple[str, str], ...], list[dict]] = {}

    def reference(env: dict[str, str]) -> list[dict]:
        key = tuple(sorted(env.items()))
        if key not in references:
            workdir = probe_dir(tmp_path_factory.mktemp("torchrun"))
            references[key] = torchrun(workdir, "torchrun", env)
        return references[key]

    return reference


def torchrun(workdir: Path, tag: str, env: dict[str, str]) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
        + ["env_probe.py", "out", tag],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **env},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return seen(workdir, tag)


def ours(workdir: Path, tag: str, env: dict[str, str], *options: str) -> list[dict]:
    proc = run_cli(
        "run",
        "--workers",
        "2",
        *options,
        "env_probe.py",
        "out",
        tag,
        cwd=workdir,
        env={**os.environ, **env},
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    return seen(workdir, tag)


def cold_notes(service) -> list[str]:
    """The 'started cold' lines of the newest job's logs."""
    newest = service.store.list_jobs()[0][0]
    lines, _ = service.logs(newest.id)
    return [item["line"] for item in lines if "started cold" in item["line"]]


# Issue 23's rows: each variable and what it does that a program can see (the probe reports
# it): c10d's debug level, str hashes, the warnings filters, UTF-8 mode.
ROWS = {
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    "PYTHONHASHSEED": "0",
    "PYTHONWARNINGS": "error",
    "PYTHONUTF8": "1",
}


def test_interpreter_and_torch_variables_as_under_torchrun(
    pool_mode, service, tmp_path, torchrun_seen
):
    """Set in the environment `mlcluster run` starts from (as in a kernel's), each row's
    variable has its effect in every rank, warm or cold, as under torchrun (the same hash of
    a string with the seed, DETAIL, 'error' first among the warnings filters, UTF-8 mode); a
    variable a warm rank cannot apply starts the job cold, said once, naming each."""
    workdir = probe_dir(tmp_path / "w")
    reference = torchrun_seen(ROWS)
    assert reference[0]["debug_level"] == "DebugLevel.DETAIL"
    assert reference[0]["hash"] == reference[1]["hash"]  # the seed's
    assert reference[0]["utf8_mode"] == 1 and reference[0]["warnoptions"] == ["error"]
    # The pool is running already (as in a working notebook), started without them.
    ours(workdir, "warmup", {})
    assert ours(workdir, "ours", ROWS) == reference
    notes = cold_notes(service)
    if pool_mode == "warm":
        (note,) = notes
        for name in ("PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONUTF8"):
            assert f"{name}={ROWS[name]!r} (the warm pool's: unset)" in note
        # re-applied in the warm rank itself: not a reason to start cold
        assert "TORCH_DISTRIBUTED_DEBUG" not in note
    else:
        assert notes == []
    # The job's own --env has the same effect.
    options = [arg for name, value in ROWS.items() for arg in ("--env", f"{name}={value}")]
    assert ours(workdir, "option", {}, *options) == reference


def test_a_variable_torch_reads_natively_is_reapplied_in_a_warm_rank(
    service, tmp_path, torchrun_seen
):
    """TORCH_DISTRIBUTED_DEBUG alone: c10d read it in C++ when the pool loaded torch; a warm
    rank sets the level again from its own environment and stays warm."""
    workdir = probe_dir(tmp_path / "w")
    reference = torchrun_seen({"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    ours(workdir, "warmup", {"MLCLUSTER_WARM_POOL": "1"})
    detail = ours(
        workdir, "ours", {"MLCLUSTER_WARM_POOL": "1", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    )
    assert [r["debug_level"] for r in detail] == [r["debug_level"] for r in reference]
    assert cold_notes(service) == []


def test_warm_ranks_stay_warm_when_nothing_differs(service, monkeypatch, tmp_path):
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "1")
    workdir = probe_dir(tmp_path / "w")
    ours(workdir, "first", {})
    ours(workdir, "second", {})
    assert cold_notes(service) == []


HF_VARIABLES = {
    "HF_HOME": "/tmp/mlcluster-hf-home",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
}


def test_variables_read_by_a_preloaded_module_as_under_torchrun(
    pool_mode, service, tmp_path, torchrun_seen
):
    """HF_HOME, HF_HUB_OFFLINE, TRANSFORMERS_VERBOSITY set after the pool learned
    transformers (the first job taught it): every rank has what torchrun's have."""
    pytest.importorskip("transformers")
    workdir = probe_dir(tmp_path / "w")
    hf = {"PROBE_HF": "1"}
    reference = torchrun_seen({**hf, **HF_VARIABLES})
    first = ours(workdir, "learn", hf)
    assert first[0]["hf_home"] != HF_VARIABLES["HF_HOME"]
    assert ours(workdir, "ours", {**hf, **HF_VARIABLES}) == reference
    if pool_mode == "warm":
        (note,) = cold_notes(service)
        for name, value in HF_VARIABLES.items():
            assert f"{name}={value!r}" in note


# -- the property -----------------------------------------------------------------------------

PROBED = ("MLC_PROBE_A", "MLC_PROBE_B", "MLC_PROBE_C")
PROBED_MODULE = f"""import os

# What a fresh interpreter finds when this module is imported (a preloaded package's
# settings read at import, as huggingface_hub's are).
AT_IMPORT = {{name: os.environ.get(name) for name in {PROBED!r}}}
"""
READER = """import json, os, sys
import mlc_env_probe

with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as f:
    json.dump(mlc_env_probe.AT_IMPORT, f)
"""


def test_a_variable_read_at_import_by_a_preloaded_module_has_the_cold_value(
    service, monkeypatch, tmp_path
):
    """Property: whatever values (or none) the submitter's environment gives the variables a
    preloaded module reads at import, set in the CLI's environment or in the submitting
    process's (a kernel's), every rank's module saw exactly those, as a fresh interpreter
    would: warm where they match what the pool imported with, cold where they do not."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from jupyterlab_mlcluster.jobs.model import JobSpec
    from jupyterlab_mlcluster.runtime.payload import Payload

    modules = tmp_path / "modules"  # on PYTHONPATH: an installed module the pool may learn
    modules.mkdir()
    (modules / "mlc_env_probe.py").write_text(PROBED_MODULE)
    script = tmp_path / "reader.py"
    script.write_text(READER)
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "1")
    monkeypatch.setenv("PYTHONPATH", f"{modules}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    for name in PROBED:
        monkeypatch.delenv(name, raising=False)
    runs = iter(range(1_000_000))

    @settings(max_examples=examples(8), suppress_health_check=list(HealthCheck), deadline=None)
    @given(
        values=st.dictionaries(
            st.sampled_from(PROBED), st.text("abcXYZ019_-./ ", max_size=6), max_size=3
        ),
        where=st.sampled_from(["cli", "submitter"]),
    )
    def check(values: dict[str, str], where: str) -> None:
        out = tmp_path / f"out-{next(runs)}"
        out.mkdir()
        if where == "cli":
            proc = run_cli(
                "run", "--workers", "2", str(script), str(out), env={**os.environ, **values}
            )
            assert proc.returncode == 0, proc.stderr
        else:
            record = service.submit(
                JobSpec(workers=2),
                Payload(kind="script", filename=str(script), argv=[str(out)]),
                environ={**os.environ, **values},
                preload=["mlc_env_probe"],
            )
            assert service.wait(record.id, timeout=120).state == "succeeded", record.id
        cold = {name: values.get(name) for name in PROBED}
        for rank in (0, 1):
            assert json.loads((out / f"{rank}.json").read_text()) == cold, (where, values)

    check()
    # The property held on both paths: some jobs were served warm, some had to start cold.
    jobs = service.store.list_jobs(limit=1000)[0]
    said_cold = sum(
        any("started cold" in item["line"] for item in service.logs(job.id, 0)[0]) for job in jobs
    )
    assert 0 < said_cold < len(jobs), (said_cold, len(jobs))
