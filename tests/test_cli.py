"""The `mlcluster` command's cluster-side commands, and how `run` meets signals (the other job
commands are in test_engine)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml
from helpers import assert_no_job_processes, run_cli


@pytest.mark.slow
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


@pytest.mark.slow
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
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
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
    # (our notice, as it is: it names the rank itself)
    assert "\n[mlcluster] rank 0 had not exited 1 s after SIGTERM: killed\n" in out


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


# -- issue 30's paper cuts --------------------------------------------------------------------


@pytest.mark.parametrize("args", [["jobs", "--json"], ["jobs"]])
def test_a_reader_that_left_ends_the_listing_quietly(service, tmp_path, args):
    """`mlcluster jobs --json | head -c 50`: the reader is gone while we still write. Unix
    tools end quietly then (SIGPIPE: status 141); before, a BrokenPipeError traceback."""
    script = tmp_path / "ok.py"
    script.write_text("pass\n")
    assert run_cli("run", str(script)).returncode == 0  # a row to list
    read_end, write_end = os.pipe()
    os.close(read_end)  # gone before the first byte: every write fails
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "jupyterlab_mlcluster.cli", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_a_script_that_does_not_compile_shows_what_python_would(service, tmp_path, pool_mode):
    script = tmp_path / "broken.py"
    script.write_text("x = 1\ndef f(:\n    pass\n")
    proc = run_cli("run", "--workers", "1", str(script))
    assert proc.returncode == 1
    python = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    shown = proc.stderr.split("--- traceback of rank 0 ---\n", 1)[1]
    assert shown.strip() == python.stderr.strip()  # the file, line, caret and error: no frames
    for ours in ("worker.py", "user_code.py", "<frozen runpy>", "Traceback"):
        assert ours not in proc.stdout + proc.stderr


FAILS_WHILE_OTHERS_WAIT = (
    "import os, time\nif os.environ['RANK'] == '1':\n    raise SystemExit(3)\ntime.sleep(300)\n"
)


def test_job_level_notices_are_not_under_a_ranks_prefix(service, tmp_path):
    """A notice of the job's (written into each stopped rank's log) is printed once, as it
    is; before, `[rank 0] [mlcluster] stopping ...` and again for rank 2."""
    script = tmp_path / "fails.py"
    script.write_text(FAILS_WHILE_OTHERS_WAIT)
    proc = run_cli("run", "--workers", "3", str(script))
    assert proc.returncode == 1, proc.stderr
    (record,) = service.store.list_jobs()[0]
    logs = run_cli("logs", record.id)
    for out in (proc.stdout, logs.stdout):
        lines = out.splitlines()
        assert not [line for line in lines if re.match(r"\[rank \d+\] \[mlcluster\]", line)], out
        stopping = "[mlcluster] stopping (a rank failed): SIGTERM, then SIGKILL after 30 s"
        assert lines.count(stopping) == 1, out
        for rank in (0, 2):  # what concerns a rank names it
            assert sum(f"[mlcluster] rank {rank} was stopped because" in x for x in lines) == 1


def test_logs_keep_every_line_whole_and_in_order_when_stdout_and_stderr_share_a_file(
    service, tmp_path
):
    """`mlcluster logs JOB > file 2>&1`: every line whole, in the log's order (before, a
    block-buffered stdout came out in 8 KiB lumps after the stderr lines written since)."""
    script = tmp_path / "both.py"
    script.write_text(
        "import sys\n"
        "for i in range(1500):\n"
        "    print(f'out {i} ' + 'o' * 40, flush=True)\n"
        "    print(f'err {i} ' + 'e' * 40, file=sys.stderr, flush=True)\n"
    )
    assert run_cli("run", "--quiet", str(script)).returncode == 0
    (record,) = service.store.list_jobs()[0]
    shared = tmp_path / "shared.txt"
    with open(shared, "w") as f:
        proc = subprocess.run(
            [sys.executable, "-m", "jupyterlab_mlcluster.cli", "logs", record.id],
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=120,
            # As in a user's shell: stdout to a file is block-buffered.
            env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
        )
    assert proc.returncode == 0
    lines = shared.read_text().splitlines()
    assert len(lines) == 3000
    whole = re.compile(r"\[rank 0\] (out \d+ o{40}|err \d+ e{40})")
    assert [line for line in lines if not whole.fullmatch(line)] == []
    logged = [f"[rank 0] {line['line']}" for line in service.logs(record.id)[0]]
    assert lines == logged
