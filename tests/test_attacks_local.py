"""Attacks on local jobs (issue 13): each test names one, plays it against real rank
processes (warm pool and cold), and shows it refused."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from attacks import (
    FORGING_CELL,
    assert_forgeries_refused,
    attacker_python,
    attacker_uid,
    evil_result,
)

from jupyterlab_mlcluster.jobs.model import JobSpec
from jupyterlab_mlcluster.runtime.payload import Payload


def test_attack_forged_result_records_on_stdout(pool_mode, service, tmp_path):
    """Ranks print result and progress records on stdout (mid-line, with a made-up MAC,
    another job's key, genuine but mid-line, rank 1 posing as rank 0 with the job's key):
    the result is rank 0's own, nothing forged is loaded or shown as progress, and the
    forgeries stay in the log as the text they are. Warm and cold ranks."""
    mark = tmp_path / "unpickled"
    spec = JobSpec.from_options({"workers": 2})
    record = service.submit(spec, Payload(source=FORGING_CELL, push={"evil": evil_result(mark)}))
    final = service.wait(record.id, timeout=120)
    assert final.state == "succeeded", final.error
    assert_forgeries_refused(service, final, mark)


# -- the warm pool's socket ------------------------------------------------------------------


def _snapshot(path: Path) -> tuple:
    """What an attacker's directory looks like (to show it untouched)."""
    info = os.lstat(path)
    entries = sorted(os.listdir(path)) if stat.S_ISDIR(info.st_mode) else None
    return (info.st_mode, info.st_uid, info.st_gid, info.st_ino, entries)


@pytest.fixture
def default_pool_dirs(monkeypatch):
    """The pool's default places, under a fresh short directory (a socket path must fit in
    108 bytes): $TMPDIR, no $XDG_RUNTIME_DIR, and a home directory. Any zygote started there
    is stopped, and everything removed, after."""
    from jupyterlab_mlcluster.jobs import warm

    base = Path(tempfile.mkdtemp(prefix="mlc-", dir="/tmp"))
    tmp, home = base / "tmp", base / "home"
    tmp.mkdir(mode=0o755)
    home.mkdir(mode=0o700)
    os.chmod(tmp, 0o777 | stat.S_ISVTX)  # like /tmp
    monkeypatch.delenv("MLCLUSTER_WARM_POOL_DIR")
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "1")
    yield tmp / f"mlcluster-{os.getuid()}", home / ".cache" / "jupyterlab-mlcluster" / "warm-pool"
    from jupyterlab_mlcluster.config import get_config

    warm.stop(get_config())
    shutil.rmtree(base, ignore_errors=True)


def _foreign(kind: str, path: Path, elsewhere: Path) -> None:
    """Plant what another local user could have made at `path` before us."""
    if kind == "wrong mode":
        path.mkdir()
        os.chmod(path, 0o777)  # anyone may put a socket of theirs in here
    elif kind == "symlink":
        elsewhere.mkdir(mode=0o700)
        path.symlink_to(elsewhere)  # our files would land where the link's maker says
    else:  # "another user's"
        path.mkdir(mode=0o700)
        os.chown(path, attacker_uid(), -1)


@pytest.mark.parametrize("kind", ["wrong mode", "symlink", "another user's"])
def test_attack_precreated_pool_directory(kind, service, default_pool_dirs, tmp_path):
    """Another user pre-creates $TMPDIR/mlcluster-<uid> (open to all, a link to their own
    directory, or theirs outright) to receive the environment the submitter sends to the
    zygote. The pool never uses it nor changes it, says so, and uses a safe directory of its
    own; the job runs (warm)."""
    planted, fallback = default_pool_dirs
    _foreign(kind, planted, tmp_path / "theirs")
    before = _snapshot(planted)
    with pytest.warns(RuntimeWarning, match=f"warm pool: not using {planted}"):
        record = service.submit(JobSpec.from_options({"workers": 1}), Payload(source="6 * 7"))
    final = service.wait(record.id, timeout=120)
    assert final.state == "succeeded", final.error
    assert service.result(record.id) == ("value", 42)
    assert _snapshot(planted) == before
    if kind == "symlink":
        assert os.listdir(tmp_path / "theirs") == []
    assert [p.suffix for p in fallback.iterdir()].count(".sock") == 1  # the warm pool, safe
    assert stat.S_IMODE(os.lstat(fallback).st_mode) == 0o700


def test_attack_no_safe_pool_directory_runs_cold(service, default_pool_dirs, tmp_path):
    """Every place the pool could use is someone else's: jobs start cold, and it says why."""
    planted, fallback = default_pool_dirs
    _foreign("wrong mode", planted, tmp_path / "theirs")
    fallback.parent.mkdir(parents=True)
    _foreign("symlink", fallback, tmp_path / "theirs-too")
    before = (_snapshot(planted), _snapshot(fallback))
    with pytest.warns(RuntimeWarning, match="warm pool off, jobs start cold"):
        record = service.submit(JobSpec.from_options({"workers": 1}), Payload(source="6 * 7"))
    final = service.wait(record.id, timeout=120)
    assert final.state == "succeeded", final.error
    assert (_snapshot(planted), _snapshot(fallback)) == before
    assert os.listdir(tmp_path / "theirs-too") == []


ATTACKER_CLIENT = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
s.connect(sys.argv[1])
try:
    s.sendall(json.dumps({"op": "status"}).encode() + b"\\n")
    print(repr(s.recv(65536)))
except OSError as exc:  # hung up on before the request was even read
    print(type(exc).__name__)
"""


@pytest.mark.slow
def test_attack_another_user_talks_to_the_zygote(tmp_path, monkeypatch):
    """The zygote's socket is reachable by another user (a careless chmod): the zygote checks
    the caller's uid (SO_PEERCRED) and hangs up without a word."""
    from jupyterlab_mlcluster.config import get_config
    from jupyterlab_mlcluster.jobs import warm

    uid = attacker_uid()
    pool = Path(tempfile.mkdtemp(prefix="mlc-pool-", dir="/tmp"))  # reachable by that user
    monkeypatch.setenv("MLCLUSTER_WARM_POOL_DIR", str(pool))
    config = get_config()
    try:
        sock = warm.ensure_zygote(config)
        assert sock is not None
        os.chmod(pool, 0o711)
        os.chmod(sock, 0o666)
        heard = subprocess.run(
            [attacker_python(), "-c", ATTACKER_CLIENT, str(sock)],
            check=False,
            user=uid,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert heard.returncode == 0, heard.stderr
        assert heard.stdout.strip() in ("b''", "BrokenPipeError", "ConnectionResetError")
        os.chmod(pool, 0o700)
        assert warm.request(sock, {"op": "status"})["children"] == 0  # still ours, idle
    finally:
        os.chmod(pool, 0o700)
        warm.stop(config)
        shutil.rmtree(pool, ignore_errors=True)


ATTACKER_SERVER = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
os.chmod(sys.argv[1], 0o666)
s.listen(8)
print("listening", flush=True)
s.settimeout(60)
with open(sys.argv[2], "wb") as heard:
    while True:
        try:
            conn, _ = s.accept()
        except OSError:
            break
        conn.settimeout(5)
        try:
            while data := conn.recv(65536):
                heard.write(data)
                heard.flush()
        except OSError:
            pass
        conn.close()
"""


def test_attack_zygote_socket_served_by_another_user(service, tmp_path, monkeypatch):
    """A socket file of ours in the pool directory (lstat passes), but the process listening
    behind it is another user's: the submitter checks the peer's uid (SO_PEERCRED) and sends
    it nothing, not even a ping; the job runs anyway."""
    from jupyterlab_mlcluster.jobs import warm

    uid = attacker_uid()
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "1")
    monkeypatch.setenv("SECRET_TOKEN", "must-not-leave")
    lair = Path(tempfile.mkdtemp(prefix="mlc-lair-", dir="/tmp"))
    os.chown(lair, uid, -1)
    heard = lair / "heard"
    server = subprocess.Popen(
        [attacker_python(), "-c", ATTACKER_SERVER, str(lair / "s.sock"), str(heard)],
        user=uid,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout.readline().strip() == "listening"
        config = service.config
        target = warm.socket_path(warm.fingerprint(list(config.warm_pool_modules)))
        warm.stop(config)
        os.chown(lair / "s.sock", os.getuid(), -1)  # looks like ours to lstat
        os.replace(lair / "s.sock", target)
        with pytest.raises(ConnectionRefusedError, match="another user's process"):
            warm.request(target, {"op": "ping"})
        record = service.submit(JobSpec.from_options({"workers": 1}), Payload(source="6 * 7"))
        final = service.wait(record.id, timeout=120)
        assert final.state == "succeeded", final.error
        assert not heard.exists() or heard.read_bytes() == b""
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(lair, ignore_errors=True)


# -- bounded by job ------------------------------------------------------------------------


def test_attack_a_result_over_the_cap_fails_the_job_clearly(service, store_dir):
    """A job returning more than MLClusterConfig.max_result_mib (the store's disk is every
    job's) fails saying so, and leaves no result behind."""
    from jupyterlab_mlcluster.config import MLClusterConfig
    from jupyterlab_mlcluster.jobs.service import JobService

    capped = JobService(config=MLClusterConfig(max_result_mib=1))
    record = capped.submit(JobSpec.from_options({}), Payload(source="b'x' * (3 * 2**20)\n"))
    final = capped.wait(record.id, timeout=120)
    assert final.state == "failed", final
    assert "max_result_mib" in final.error and "3.0 MiB" in final.error, final.error
    assert not capped.store.result_path(record.id).exists()
    assert not capped.store.result_json_path(record.id).exists()


def test_attack_a_job_flooding_its_log_is_truncated_and_goes_on(service, store_dir):
    """A job printing past MLClusterConfig.max_log_mib keeps its first MiB, one line per rank
    says the log was truncated, the rest is dropped, and the job runs on to its result."""
    from jupyterlab_mlcluster.config import MLClusterConfig
    from jupyterlab_mlcluster.jobs.service import JobService

    capped = JobService(config=MLClusterConfig(max_log_mib=1))
    flood = "import sys\nfor i in range(40000):\n    print('x' * 100)\nprint('the end')\n'done'\n"
    record = capped.submit(JobSpec.from_options({"workers": 2}), Payload(source=flood))
    final = capped.wait(record.id, timeout=180)
    assert final.state == "succeeded", final.error
    assert capped.result(record.id) == ("value", "done")
    kept = sum(capped.store.log_path(record.id, r).stat().st_size for r in (0, 1))
    assert abs(kept - (1 << 20)) < 4096, kept  # 8 MiB were printed; 1 MiB and the notes kept
    for rank in (0, 1):
        lines = capped.store.log_path(record.id, rank).read_text().splitlines()
        notes = [line for line in lines if "log truncated after 1 MiB" in line]
        assert len(notes) == 1 and "max_log_mib" in notes[0], lines[-3:]
        assert not any(line.endswith("the end") for line in lines)


# -- the store root --------------------------------------------------------------------------


def test_attack_store_root_precreated_by_another_user_is_refused(tmp_path):
    """Another user makes the store's directory first (a shared machine, a guessable path):
    opening it is refused, saying why, and nothing of ours is written there."""
    from jupyterlab_mlcluster.jobs.storage.store import JobStore, UnsafeStore

    root = tmp_path / "store"
    root.mkdir(mode=0o700)
    os.chown(root, attacker_uid(), -1)
    with pytest.raises(UnsafeStore) as refused:
        JobStore(root)
    assert f"belongs to uid {attacker_uid()}" in str(refused.value)
    assert "MLCLUSTER_STORE_DIR" in str(refused.value)
    assert os.listdir(root) == []


@pytest.mark.slow
def test_attack_store_root_others_may_write_is_refused(tmp_path):
    from jupyterlab_mlcluster.jobs.storage.store import JobStore, UnsafeStore

    root = tmp_path / "store"
    root.mkdir()
    os.chmod(root, 0o777)
    with pytest.raises(UnsafeStore) as refused:
        JobStore(root)
    assert "mode 777" in str(refused.value) and "chmod 700" in str(refused.value)
    assert os.listdir(root) == []
    # The CLI says so too, and changes nothing.
    result = subprocess.run(
        [sys.executable, "-m", "jupyterlab_mlcluster.cli", "jobs"],
        env={**os.environ, "MLCLUSTER_STORE_DIR": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "mlcluster: error: the job store" in result.stderr, result
    assert "Traceback" not in result.stderr
    assert os.listdir(root) == []
    os.chmod(root, 0o700)  # fixed as told: it opens
    JobStore(root)
