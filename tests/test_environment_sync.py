"""The pure pieces of syncing the notebook's packages into job pods (the whole story, run
for real, is tests/kube/test_package_sync.py): what counts as added, where the wheel cache
is, which index settings travel (never credentials), the baseline recorded once."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jupyterlab_mlcluster import environment
from jupyterlab_mlcluster.backends.kubernetes.packages import find_cache_volume, index_settings


def info(version, user_site=False, direct_url=None):
    return {"version": version, "user_site": user_site, "direct_url": direct_url}


def test_changes_are_what_was_added_or_changed_since_the_pod_started():
    baseline = {"torch": "2.13.0", "numpy": "2.1.0", "six": "1.16.0"}
    now = {
        "torch": info("2.13.0"),
        "numpy": info("2.2.0"),  # upgraded in the notebook
        "tinypkg": info("0.1"),
        "mine": info("0.3", direct_url={"url": "file:///src/mine", "dir_info": {"editable": True}}),
        "fromgit": info(
            "1.0",
            direct_url={
                "url": "https://example.com/x.git",
                "vcs_info": {"vcs": "git", "commit_id": "abc123"},
            },
        ),
        "homepkg": info("1.0", user_site=True),  # ~/.local is on the home volume, never the image's
    }
    baseline["homepkg"] = "1.0"
    wanted, skipped = environment.changes(baseline, now)
    assert wanted == [
        "fromgit @ git+https://example.com/x.git@abc123",
        "homepkg==1.0",
        "numpy==2.2.0",
        "tinypkg==0.1",
    ]
    assert skipped == ["mine"]  # editable: its source is on the notebook's disk


@pytest.mark.slow
def test_the_first_baseline_of_a_pod_wins(tmp_path):
    path = environment.record_baseline(tmp_path)
    assert path is not None and oct(path.stat().st_mode & 0o777) == "0o600"
    first = path.read_text()
    assert environment.record_baseline(tmp_path) == path and path.read_text() == first
    assert "pip" in environment.read_baseline(tmp_path)
    path.write_text("not json")  # unreadable: nothing is synced, never a guess
    assert environment.read_baseline(tmp_path) is None
    assert environment.changes_since_baseline(tmp_path) is None


def test_the_wheel_cache_is_found_on_the_claim_the_notebook_mounts():
    pod = {
        "spec": {
            "containers": [
                {
                    "volumeMounts": [
                        {"name": "home", "mountPath": "/home/jovyan"},
                        {"name": "team", "mountPath": "/home/jovyan/team", "subPath": "ml"},
                        {"name": "scratch", "mountPath": "/scratch"},
                    ]
                }
            ],
            "volumes": [
                {"name": "home", "persistentVolumeClaim": {"claimName": "home-rwo"}},
                {"name": "team", "persistentVolumeClaim": {"claimName": "team-rwx"}},
                {"name": "scratch", "emptyDir": {}},
            ],
        }
    }
    assert find_cache_volume(pod, "/home/jovyan/team/wheels") == (
        "team-rwx",
        "/home/jovyan/team",
        "ml",
    )
    assert find_cache_volume(pod, "/home/jovyan/teamx") == ("home-rwo", "/home/jovyan", None)
    assert find_cache_volume(pod, "/scratch/wheels") is None  # not a claim: pods cannot share it
    assert find_cache_volume(pod, "/opt/wheels") is None


def test_index_settings_travel_without_credentials():
    config = (  # `pip config list`
        "global.index-url='https://user:s3cret@pypi.corp.example/simple'\n"
        "global.timeout='60'\n"
        ":env:.extra-index-url='https://download.pytorch.org/whl/cpu'\n"
        "install.trusted-host='pypi.corp.example'\n"
    )
    settings, notes = index_settings(config)
    assert dict(settings) == {
        "PIP_INDEX_URL": "https://pypi.corp.example/simple",
        "PIP_EXTRA_INDEX_URL": "https://download.pytorch.org/whl/cpu",
        "PIP_TRUSTED_HOST": "pypi.corp.example",
    }
    assert "s3cret" not in json.dumps([settings, notes])
    assert len(notes) == 1 and "credentials" in notes[0]


def test_a_pods_first_step_speaks_for_the_rank_its_lines_belong_to():
    from jupyterlab_mlcluster.runtime.sync_packages import pod_rank

    assert pod_rank({"RANK": "3", "PET_NODE_RANK": "3", "PET_NPROC_PER_NODE": "1"}) == 3
    # several ranks in the pod: torchrun is not started yet; unprefixed lines are node 2's first
    assert pod_rank({"PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "4"}) == 8
    assert pod_rank({}) == 0


def test_no_sync_packages_is_a_job_option():
    import argparse

    from jupyterlab_mlcluster.jobs.options import add_job_arguments, spec_from_args

    parser = argparse.ArgumentParser()
    add_job_arguments(parser)
    assert spec_from_args(parser.parse_args([])).sync_packages is True
    assert spec_from_args(parser.parse_args(["--no-sync-packages"])).sync_packages is False


@pytest.mark.slow
def test_a_cache_that_cannot_be_filled_is_said_and_the_pods_use_the_index(tmp_path, monkeypatch):
    not_a_directory = tmp_path / "cache"
    not_a_directory.write_text("")
    (note,) = environment.fill_wheel_cache(not_a_directory, ["tinypkg==0.1"])
    assert note.startswith(f"cannot use the wheel cache {not_a_directory}")

    monkeypatch.setenv("PIP_NO_INDEX", "1")  # nothing to download it from, offline
    (note,) = environment.fill_wheel_cache(tmp_path / "wheels", ["no-such-package-zz==9.9"])
    assert note.startswith("could not put every wheel in the cache (the pods use the index")
    assert list((tmp_path / "wheels").iterdir()) == []  # nothing half-written


def test_the_pods_step_takes_requirements_never_pip_options(monkeypatch, capsys):
    """$MLCLUSTER_SYNC_PACKAGES holding a pip option (another index, a config file) is
    refused before pip runs: the rank fails with a clear error."""
    from jupyterlab_mlcluster.runtime import sync_packages

    ran = []
    monkeypatch.setattr(sync_packages.subprocess, "run", lambda *a, **k: ran.append(a))
    for evil in (["--index-url=http://evil.example/simple", "x"], [""], "x==1", [1]):
        monkeypatch.setenv("MLCLUSTER_SYNC_PACKAGES", json.dumps(evil))
        assert sync_packages.main(["true"]) == 1
        assert "MLCLUSTER_SYNC_PACKAGES is malformed" in capsys.readouterr().out
    assert ran == []


def test_the_pods_step_reads_cache_files_by_plain_names_only(monkeypatch, capsys):
    """$MLCLUSTER_WHEEL_FILES naming a path out of the cache, or not a wheel, or a size that
    is no size, is refused before anything is read or run; so are hashes for some
    requirements only (pip would then install the rest unpinned)."""
    from jupyterlab_mlcluster.runtime import sync_packages

    ran = []
    monkeypatch.setattr(sync_packages.subprocess, "run", lambda *a, **k: ran.append(a))
    monkeypatch.setenv("MLCLUSTER_SYNC_PACKAGES", json.dumps(["demo==1.0", "other==2"]))
    monkeypatch.setenv("MLCLUSTER_WHEEL_HASHES", json.dumps({"demo==1.0": ["ab" * 32]}))
    assert sync_packages.main(["true"]) == 1
    assert "MLCLUSTER_WHEEL_HASHES is malformed" in capsys.readouterr().out
    monkeypatch.setenv("MLCLUSTER_SYNC_PACKAGES", json.dumps(["demo==1.0"]))
    for evil in (
        ["../../etc/demo-1.0-py3-none-any.whl", 10],
        ["/etc/passwd", 10],
        ["demo-1.0-py3-none-any.whl", -1],
        ["demo-1.0-py3-none-any.whl", True],
        ["demo-1.0-py3-none-any.whl"],
    ):
        monkeypatch.setenv("MLCLUSTER_WHEEL_FILES", json.dumps({"demo==1.0": [evil]}))
        assert sync_packages.main(["true"]) == 1
        assert "MLCLUSTER_WHEEL_FILES is malformed" in capsys.readouterr().out
    assert ran == []


def test_only_a_wheel_of_the_notebooks_own_files_is_trusted_from_the_shared_cache(tmp_path):
    """The wheel cache lies on a volume others may write. A wheel there counts only when
    every file it holds is byte for byte the notebook's installed one; the pods then pin it
    by its hash. Played by the attacker: changed code, a .pth smuggled into site-packages,
    an entry point that would shadow `python`, a script."""
    import hashlib
    import zipfile
    from importlib import metadata

    dist = metadata.distribution("cloudpickle")
    version, info = dist.version, f"cloudpickle-{dist.version}.dist-info"
    genuine = {
        "cloudpickle/__init__.py": dist.locate_file("cloudpickle/__init__.py").read_bytes(),
        f"{info}/METADATA": dist.read_text("METADATA").encode(),
    }
    requirement = f"cloudpickle=={version}"

    def cache_with(extra: dict[str, bytes]) -> tuple:
        cache = tmp_path / f"cache{len(list(tmp_path.iterdir()))}"
        cache.mkdir()
        wheel = cache / f"cloudpickle-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            for path, data in {**genuine, **extra}.items():
                z.writestr(path, data)
        return wheel, environment.checked_wheels(cache, [requirement])

    wheel, (hashes, notes) = cache_with({})
    data = wheel.read_bytes()
    assert hashes == {requirement: [(wheel.name, len(data), hashlib.sha256(data).hexdigest())]}
    assert notes == []
    attacks = {
        "changed code": {"cloudpickle/__init__.py": genuine["cloudpickle/__init__.py"] + b"#"},
        "a .pth": {f"cloudpickle-{version}.data/purelib/x.pth": b"import os"},
        "an entry point": {f"{info}/entry_points.txt": b"[console_scripts]\npython = x:y\n"},
        "a script": {f"cloudpickle-{version}.data/scripts/python": b"#!/bin/sh\n"},
    }
    for attack, extra in attacks.items():
        wheel, (hashes, notes) = cache_with(extra)
        assert hashes is None, attack
        assert (
            notes[0]
            == f"the wheel cache's {wheel.name} is not what the notebook has installed: not used"
        )


def pod_step(tmp_path: Path, cache: Path, checked: Path, **pip: str):
    """The pod's first step, run for real in a fresh environment with pip, the cache's
    `checked` wheel recorded at submit (its name, size and sha256, as the notebook sends
    them). `pip`: the pod's PIP_* variables (no index unless given). Returns (pip's run,
    the VALUE of the tinypkg installed or None)."""
    import hashlib
    import subprocess

    from tests.kube.test_package_sync import REPO, image_env

    data = checked.read_bytes()
    pod = image_env(tmp_path / f"pod{len(list(tmp_path.glob('pod*')))}")
    done = subprocess.run(
        [
            str(pod / "bin" / "python"),
            "-m",
            "jupyterlab_mlcluster.runtime.sync_packages",
            str(pod / "bin" / "python"),
            "-c",
            "import tinypkg; print('rank imports', tinypkg.VALUE)",
        ],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
            "PYTHONPATH": str(REPO),
            "PIP_NO_INDEX": "1",  # no index to fall back on unless PIP_FIND_LINKS plays one
            **pip,
            "MLCLUSTER_SYNC_PACKAGES": json.dumps(["tinypkg==0.1"]),
            "MLCLUSTER_WHEEL_CACHE": str(cache),
            "MLCLUSTER_WHEEL_HASHES": json.dumps(
                {"tinypkg==0.1": [hashlib.sha256(data).hexdigest()]}
            ),
            "MLCLUSTER_WHEEL_FILES": json.dumps({"tinypkg==0.1": [[checked.name, len(data)]]}),
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    installed = next(iter((pod / "lib").glob("python3.*/site-packages/tinypkg/__init__.py")), None)
    value = installed.read_text().split("'")[1] if installed else None
    return done, value


@pytest.mark.slow
def test_attack_a_wheel_planted_in_the_shared_cache_neither_fails_the_job_nor_is_installed(
    tmp_path,
):
    """Someone who may write the shared wheel cache puts their own tinypkg 0.1 beside the one
    the notebook checked, under a tag pip prefers (py311 over py3). The pod's first step
    installs the checked wheel (its private copy) and runs the rank; the planted one is
    never offered to pip, never installed (before, pip got the cache itself, picked the
    planted wheel, failed its hash check: every job syncing from the cache failed)."""
    from tests.kube.test_package_sync import build_wheel

    cache = tmp_path / "cache"
    cache.mkdir()
    checked = build_wheel(cache, "tinypkg", "0.1", "genuine")
    attacker = tmp_path / "attacker"
    attacker.mkdir()
    build_wheel(attacker, "tinypkg", "0.1", "planted").rename(
        cache / "tinypkg-0.1-py311-none-any.whl"
    )
    done, value = pod_step(tmp_path, cache, checked)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "rank imports genuine" in out, out
    assert value == "genuine"
    assert "installed 1 package (tinypkg==0.1) from the wheel cache" in out, out


def test_attack_tiny_files_planted_in_the_wheel_cache_do_not_crowd_out_the_checked_wheel(
    tmp_path,
):
    """Red team T2: 1-byte files named like the wanted wheel (tinypkg-0.1-<n>-py3-none-any.whl),
    100 of them (8 were enough). Before, candidates were read smallest first, at most 8: the
    planted files filled the window, the checked wheel was never read, and the pod went to
    the index with no hashes (an air-gapped job failed; elsewhere whatever the index served
    ran). Now the pod reads only the file the notebook recorded at submit (exact name and
    size): the plants are never read, and the checked wheel is installed from the cache."""
    planted = 100
    from tests.kube.test_package_sync import build_wheel

    cache = tmp_path / "cache"
    cache.mkdir()
    checked = build_wheel(cache, "tinypkg", "0.1", "genuine")
    for n in range(planted):
        (cache / f"tinypkg-0.1-{n}-py3-none-any.whl").write_bytes(b"x")
    done, value = pod_step(tmp_path, cache, checked)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert value == "genuine" and "rank imports genuine" in out, out
    assert "installed 1 package (tinypkg==0.1) from the wheel cache" in out, out
    assert "not the one the notebook checked" not in out, out  # no plant was read


@pytest.mark.parametrize("swap", ["another size", "same size, another sha256"])
def test_attack_a_swapped_checked_wheel_sends_the_pod_to_the_index_pinned_to_the_checked_hash(
    tmp_path, swap
):
    """The checked wheel's own file in the shared cache is replaced by the attacker's build
    of tinypkg 0.1 (another size; or the same size, other bytes), and the index the pods use
    serves that build too (dependency confusion: a wheel the notebook built has no index
    copy, or an extra index answers for it). Before, the pod fell back to the index with no
    hashes and the attacker's code ran as the rank. Now the swapped file is not used (said),
    the index is asked only for the checked sha256 (`--require-hashes`): nothing is
    installed, the rank never runs, and the job's error says the cache lost the wheel."""
    from tests.kube.test_package_sync import build_wheel

    cache, saved, index = tmp_path / "cache", tmp_path / "saved", tmp_path / "index"
    for d in (cache, saved, index):
        d.mkdir()
    checked = build_wheel(saved, "tinypkg", "0.1", "genuine")
    evil = build_wheel(index, "tinypkg", "0.1", "evil" if swap == "another size" else "planted")
    assert (evil.stat().st_size == checked.stat().st_size) == (swap != "another size")
    (cache / checked.name).write_bytes(evil.read_bytes())
    done, value = pod_step(tmp_path, cache, checked, PIP_FIND_LINKS=str(index))
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert value is None and "rank imports" not in out, out
    why = "another sha256" if swap != "another size" else f"{evil.stat().st_size} bytes"
    assert f"the wheel cache's {checked.name} is not the one the notebook checked" in out, out
    assert why in out, out
    assert (
        "pip could not install 1 package (tinypkg==0.1) from the package index, pinned to the "
        "sha256 the notebook checked at submit (the wheel cache holds no checked wheel of "
        "tinypkg==0.1): " in out
    ), out
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in out, out


def test_attack_eight_tiny_files_are_not_read_and_the_checked_wheel_is_copied(tmp_path):
    """T2's own numbers, where the copies are made: 8 one-byte plants (the old window) and
    the genuine wheel, 1600 bytes: nothing is said of the plants (none is read), the pod's
    private copy is the genuine wheel, and pip gets that copy alone, pinned."""
    import hashlib

    from jupyterlab_mlcluster.runtime import sync_packages

    cache, private = tmp_path / "cache", tmp_path / "private"
    cache.mkdir()
    private.mkdir(mode=0o700)
    genuine = cache / "mypkg-0.1-py3-none-any.whl"
    genuine.write_bytes(b"PK-genuine-wheel" * 100)
    for n in range(8):
        (cache / f"mypkg-0.1-{n}-py3-none-any.whl").write_bytes(b"x")
    hashes = {"mypkg==0.1": [hashlib.sha256(genuine.read_bytes()).hexdigest()]}
    files = {"mypkg==0.1": [(genuine.name, 1600)]}
    missing, notes = sync_packages.verified_copies(cache, ["mypkg==0.1"], hashes, files, private)
    assert (missing, notes) == ([], [])
    assert [p.read_bytes() for p in private.iterdir()] == [genuine.read_bytes()]
    work = tmp_path / "work"
    work.mkdir()
    command, source, _ = sync_packages.pip_command(["mypkg==0.1"], cache, hashes, work, files)
    assert source == "the wheel cache" and "--require-hashes" in command
    assert command[-2:] == ["--find-links", str(work / "wheels")] and "--no-index" in command


def test_the_index_is_pinned_to_the_checked_hashes_whenever_the_notebook_checked_a_wheel(
    tmp_path,
):
    """The cache had the wheel at submit and no longer has it (deleted; or a plan from
    before file names were recorded): the index may serve only that very file, by its
    sha256; an index-only job (nothing checked at submit) is left as it was."""
    from jupyterlab_mlcluster.runtime import sync_packages

    cache = tmp_path / "cache"
    cache.mkdir()
    digest = "ab" * 32
    for i, files in enumerate([{"demo==1.0": [("demo-1.0-py3-none-any.whl", 22)]}, None]):
        work = tmp_path / f"work{i}"
        work.mkdir()
        command, source, notes = sync_packages.pip_command(
            ["demo==1.0"], cache, {"demo==1.0": [digest]}, work, files
        )
        assert "--require-hashes" in command and "--no-index" not in command
        pinned = Path(command[command.index("-r") + 1]).read_text()
        assert pinned == f"demo==1.0 --hash=sha256:{digest}\n"
        assert "demo==1.0" not in command  # only through the pinned file
        assert source.startswith("the package index, pinned to the sha256 the notebook checked")
        assert notes == (
            [
                "the wheel cache's demo-1.0-py3-none-any.whl is not the one the notebook checked "
                "at submit (gone): not used"
            ]
            if files
            else ["no wheel file of demo==1.0 was recorded at submit: the cache is not read"]
        )
    work = tmp_path / "index-only"
    work.mkdir()
    command, source, _ = sync_packages.pip_command(["demo==1.0"], None, {}, work)
    assert command[-1] == "demo==1.0" and "--require-hashes" not in command
    assert source == "the package index"


def test_attack_a_huge_or_growing_file_planted_in_the_wheel_cache_costs_the_pod_no_disk(tmp_path):
    """A file named like the wanted wheel, planted in the shared cache, 1 GiB but sparse (no
    disk of the attacker's), or grown while it is read: the pod's private copies live on a
    3 MiB tmpfs here. Before, each was copied whole before its hash was compared: the pod's
    disk filled (an eviction on a node). Now it is hashed where it lies and never copied;
    the genuine wheel beside it is still found and copied."""
    import hashlib
    import threading

    from jupyterlab_mlcluster.runtime import sync_packages
    from tests.faults.fulldisk import mounted

    cache = tmp_path / "cache"
    cache.mkdir()
    genuine = cache / "demo-1.0-py3-none-any.whl"
    genuine.write_bytes(b"PK genuine wheel bytes")
    allowed = {"demo==1.0": [hashlib.sha256(genuine.read_bytes()).hexdigest()]}
    recorded = {"demo==1.0": [(genuine.name, genuine.stat().st_size)]}
    planted = cache / "demo-1.0-0-py3-none-any.whl"  # sorts first, a tag pip would prefer
    with mounted(tmp_path, "3m") as disk:
        if isinstance(disk, str):
            pytest.skip(disk)

        def used() -> int:
            st = os.statvfs(disk)
            return (st.f_blocks - st.f_bfree) * st.f_frsize

        figures = {"attacks": 0, "genuine copied": 0, "planted files copied": 0}
        for attack in ("sparse 1 GiB", "growing"):
            private = disk / attack.replace(" ", "-")
            private.mkdir(mode=0o700)
            planted.unlink(missing_ok=True)
            planted.touch()
            stop = threading.Event()
            if attack == "sparse 1 GiB":
                os.truncate(planted, 1 << 30)
                grower = None
            else:

                def grow(stop: threading.Event = stop) -> None:
                    size = 0
                    while not stop.is_set():
                        size += 16 << 20
                        os.truncate(planted, size)
                        stop.wait(0.005)

                grower = threading.Thread(target=grow)
                grower.start()
            peak = [used()]

            def watch(stop: threading.Event = stop, peak: list[int] = peak) -> None:
                while not stop.wait(0.002):
                    peak[0] = max(peak[0], used())

            watcher = threading.Thread(target=watch)
            watcher.start()
            try:
                missing, notes = sync_packages.verified_copies(
                    cache, ["demo==1.0"], allowed, recorded, private
                )
            finally:
                stop.set()
                watcher.join()
                if grower:
                    grower.join()
            figures["attacks"] += 1
            assert missing == [], (attack, notes)
            assert sorted(p.name for p in private.iterdir()) == [genuine.name], attack
            figures["genuine copied"] += 1
            assert notes == [], notes  # not the recorded file: never read
            # The 3 MiB disk held the genuine copy alone, all along (before: filled, ENOSPC).
            assert peak[0] < 1 << 20, (attack, peak[0])
        print("figures:", figures)


def test_attack_many_huge_files_planted_in_the_wheel_cache_are_not_read(tmp_path):
    """Sparse 1 GiB files named like the wanted wheel, as many as the attacker likes (they
    cost no disk), beside the genuine one or in its place: before, each was read and hashed
    whole (3 GiB read, seconds of a pod's start each). Now only the file recorded at submit
    is opened, and hashed only when it still has the recorded size: the bytes read (the
    kernel's rchar count of this process) stay far under one planted file."""
    import hashlib

    from jupyterlab_mlcluster.runtime import sync_packages

    cache = tmp_path / "cache"
    cache.mkdir()
    genuine = cache / "demo-1.0-py3-none-any.whl"
    genuine.write_bytes(b"PK genuine wheel bytes" * 1000)
    allowed = {"demo==1.0": [hashlib.sha256(genuine.read_bytes()).hexdigest()]}
    recorded = {"demo==1.0": [(genuine.name, genuine.stat().st_size)]}
    for tag in ("0", "1", "2"):  # each sorts before the genuine name
        with open(cache / f"demo-1.0-{tag}-py3-none-any.whl", "wb") as f:
            f.truncate(1 << 30)
    (cache / "demo-1.0-3-py3-none-any.whl").write_bytes(b"PK planted")  # smaller
    private = tmp_path / "private"
    private.mkdir(mode=0o700)

    def bytes_read() -> int:
        io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
        return int(io["rchar"])

    before = bytes_read()
    missing, notes = sync_packages.verified_copies(cache, ["demo==1.0"], allowed, recorded, private)
    read = bytes_read() - before
    assert missing == [] and notes == []
    assert [p.name for p in private.iterdir()] == [genuine.name]
    assert read < 64 << 20, f"{read} bytes read for a {genuine.stat().st_size}-byte wheel"
    # The genuine wheel itself swapped for a sparse 1 GiB file: its size differs, not read.
    (private / genuine.name).unlink()
    genuine.unlink()
    with open(genuine, "wb") as f:
        f.truncate(1 << 30)
    before = bytes_read()
    missing, notes = sync_packages.verified_copies(cache, ["demo==1.0"], allowed, recorded, private)
    swapped = bytes_read() - before
    assert missing == ["demo==1.0"] and list(private.iterdir()) == []
    assert notes == [
        f"the wheel cache's {genuine.name} is not the one the notebook checked at submit "
        f"({1 << 30} bytes, 22000 at submit): not used"
    ]
    assert swapped < 1 << 20, swapped
    print(f"figures: 4 files planted beside it, {read} bytes read; swapped: {swapped} read")
