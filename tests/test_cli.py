"""The `mlcluster` command's cluster-side commands, and how `run` meets signals (the other job
commands are in test_engine)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import yaml
from helpers import assert_no_job_processes, run_cli


def test_manifests_prints_everything_a_platform_team_applies():
    proc = run_cli(
        "manifests",
        "--namespace",
        "ml-system",
        "--host",
        "ml.example.com",
        "--oidc-issuer",
        "https://dex.example.com",
        "--audience",
        "mlcluster",
    )
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
        "RequestAuthentication",
        "ValidatingAdmissionPolicy",
    } <= kinds
    # Without an issuer: no Gateway (it could not tell users apart), and stderr says why.
    open_gateway = run_cli("manifests")
    assert open_gateway.returncode == 0
    assert "Gateway" not in {o["kind"] for o in yaml.safe_load_all(open_gateway.stdout) if o}
    assert "--oidc-issuer" in open_gateway.stderr
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


SLEEPER = "import time\nprint('ready', flush=True)\ntime.sleep(300)\n"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGQUIT])
def test_run_stops_the_job_on_a_signal_even_with_sigint_ignored(service, tmp_path, signum):
    """A background job of a non-interactive shell starts with SIGINT ignored; `mlcluster run`
    still cancels its job on Ctrl-C/SIGTERM and exits 1, like torchrun (not 130/143)."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab_mlcluster.cli", "run", "--workers", "2", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # noqa: PLW1509
    )
    try:
        ready = set()
        while len(ready) < 2:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            if line.strip().endswith("ready"):
                ready.add(line.split("]")[0])
        proc.send_signal(signum)
        assert proc.wait(timeout=60) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "cancelling job" in proc.stderr.read()
    record = service.store.list_jobs()[0][0]
    assert record.state == "cancelled"
    assert_no_job_processes(service)


STUBBORN = (
    "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\ntime.sleep(300)\n"
)


def test_grace_is_an_option_and_the_reason_says_who_was_killed(service, tmp_path):
    """--grace DURATION: the job's own time between SIGTERM and SIGKILL (default 30 s, the
    setting); a rank that ignores SIGTERM is killed after it, and the job's reason says so."""
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab_mlcluster.cli", "run", "--grace", "1s", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip().endswith("ready"), proc.stderr.read()
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 1
        assert 1.0 <= time.monotonic() - started < 20
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out, err = proc.stdout.read(), proc.stderr.read()
    (record,) = service.store.list_jobs()[0]
    assert record.reason.startswith(  # ...; where it was when it was stopped
        "cancelled by user (Ctrl-C of mlcluster run); rank 0 had not exited 1 s after SIGTERM"
        " and was killed; rank 0 was in "
    )
    assert f"job {record.id} {record.reason}" in err
    assert "[rank 0] [mlcluster] rank 0 had not exited 1 s after SIGTERM: killed" in out


@pytest.mark.parametrize(
    "args,message",
    [
        (["--grace", "soon"], "grace must be a duration like '90s'"),
        (["--grace", "0"], "greater than 0 and at most"),
        (["--grace", "5s", "--backend", "kubernetes"], "--grace applies to local ranks"),
    ],
)
def test_a_grace_that_cannot_be_honoured_is_refused(service, tmp_path, args, message):
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    proc = run_cli("run", *args, str(script))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert service.store.list_jobs()[1] == 0  # nothing stored


def test_a_failing_script_shows_only_its_own_frames(service, tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("def step():\n    raise ValueError('bad batch')\n\nstep()\n")
    proc = run_cli("run", "--workers", "1", str(script))
    assert proc.returncode == 1
    traceback = proc.stderr.split("--- traceback of rank 0 ---", 1)[1]
    assert f'File "{script}", line 4, in <module>' in traceback
    assert "in step" in traceback and "ValueError: bad batch" in traceback
    # Neither the runtime's frames nor runpy's (python bad.py shows neither).
    assert "frozen runpy" not in proc.stderr and "jupyterlab_mlcluster" not in proc.stderr
