"""The job store on a shared (network) filesystem: detected from mountinfo, the rollback
journal chosen instead of WAL and said once; the detection as a pure function of the
mountinfo text, and end to end with a fabricated mountinfo file and a real job."""

from __future__ import annotations

import logging
import sqlite3

import pytest
from traitlets import TraitError

from jupyterlab_mlcluster.config import MLClusterConfig
from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.jobs.service import JobService
from jupyterlab_mlcluster.jobs.storage import fsinfo
from jupyterlab_mlcluster.jobs.storage.store import JobStore
from jupyterlab_mlcluster.runtime.payload import Payload

LOCAL = (
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "25 22 0:21 / /proc rw,nosuid - proc proc rw\n"
    "40 22 0:35 / /tmp rw,nosuid shared:20 - tmpfs tmpfs rw,size=1024k\n"
)


def _mounted(at: str, fstype: str, source: str, base: str = LOCAL) -> str:
    return base + f"90 22 0:60 / {at} rw,relatime shared:50 - {fstype} {source} rw,vers=4.2\n"


def test_parse_mountinfo_unescapes_paths_and_skips_junk():
    text = LOCAL + "garbage line\n" + "91 22 0:61 / /home/a\\040b rw - nfs4 srv:/home rw\n"
    mounts = fsinfo.parse_mountinfo(text)
    assert [m.mount_point for m in mounts] == ["/", "/proc", "/tmp", "/home/a b"]
    assert mounts[-1] == fsinfo.Mount("/home/a b", "nfs4", "srv:/home")
    # Optional fields (shared:, master:) of any number before the separator.
    line = "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 propagate_from:2 - cifs //nas/x rw\n"
    assert fsinfo.parse_mountinfo(line) == [fsinfo.Mount("/mnt2", "cifs", "//nas/x")]


@pytest.mark.parametrize(
    "fstype",
    ["nfs", "nfs4", "cifs", "smb3", "fuse.sshfs", "lustre", "gpfs", "beegfs", "ceph"],
)
def test_network_filesystems_are_detected(fstype):
    mount = fsinfo.mount_of("/home/alice/.local/share/jupyter", _mounted("/home", fstype, "s:/h"))
    assert mount is not None and mount.mount_point == "/home" and mount.network


def test_local_filesystems_and_the_longest_mount_point():
    text = _mounted("/home", "nfs4", "srv:/home")
    assert not fsinfo.mount_of("/var/lib/x", text).network  # on / (ext4)
    assert not fsinfo.mount_of("/homework/x", text).network  # a prefix is not a parent
    # A local scratch disk mounted inside the NFS home wins (the longest mount point).
    nested = text + "95 90 8:17 / /home/alice/scratch rw - xfs /dev/sdb1 rw\n"
    assert fsinfo.mount_of("/home/alice/scratch/store", nested).fstype == "xfs"
    assert fsinfo.mount_of("/home/alice/other", nested).fstype == "nfs4"
    # The same mount point twice: the later mount hides the earlier.
    over = nested + "96 22 0:70 / /home rw - ext4 /dev/sdc1 rw\n"
    assert fsinfo.mount_of("/home/alice/other", over).fstype == "ext4"
    assert fsinfo.mount_of("/x", "") is None


def _journal(store: JobStore) -> str:
    db = sqlite3.connect(store.db_path)
    try:
        return db.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        db.close()


def test_a_store_on_nfs_uses_the_rollback_journal_and_says_so_once(tmp_path, caplog):
    """The store pointed at a path that the (fabricated) mountinfo puts on NFS: DELETE
    journal mode, one warning for any number of stores and connections; a real job runs on
    it and its supervisor keeps that mode."""
    root = tmp_path / "home" / "store"
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(_mounted(str(tmp_path / "home"), "nfs4", "filer:/export/home"))
    caplog.set_level(logging.WARNING, logger="jupyterlab_mlcluster.store")
    store = JobStore(root, mountinfo=mountinfo)
    assert store.journal_mode == "delete" and _journal(store) == "delete"
    again = JobStore(root, mountinfo=mountinfo)
    again.list_jobs()
    said = [r.getMessage() for r in caplog.records if "network filesystem" in r.getMessage()]
    assert len(said) == 1, said
    assert "nfs4 filer:/export/home" in said[0] and "journal_mode=DELETE" in said[0]

    service = JobService(MLClusterConfig(warm_pool=False), store=store)
    job = service.submit(JobSpec.from_options({"workers": 2}), Payload(source="print('nfs')"))
    assert service.wait(job.id, timeout=120).state == JobState.SUCCEEDED
    assert [line["line"] for line in service.logs(job.id)[0]] == ["nfs", "nfs"]
    assert _journal(store) == "delete"
    assert not root.joinpath("jobs.db-wal").exists()
    # Its supervisor opened the store the submitter's way (never wanting WAL back).
    assert "journal mode" not in (store.job_dir(job.id) / "supervisor.log").read_text()


def test_a_local_store_keeps_wal(tmp_path):
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(_mounted("/elsewhere", "nfs4", "filer:/x"))
    store = JobStore(tmp_path / "store", mountinfo=mountinfo)
    assert store.journal_mode == "wal" and _journal(store) == "wal"


def test_the_journal_mode_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("MLCLUSTER_STORE_DIR", str(tmp_path / "store"))
    forced = JobService(MLClusterConfig(store_journal_mode="delete"))
    assert _journal(forced.store) == "delete"
    assert MLClusterConfig().store_journal_mode == "auto"
    monkeypatch.setenv("MLCLUSTER_STORE_JOURNAL_MODE", "wal")
    assert MLClusterConfig().store_journal_mode == "wal"
    with pytest.raises(TraitError):
        MLClusterConfig(store_journal_mode="memory")
    with pytest.raises(ValueError, match="journal_mode"):
        JobStore(tmp_path / "other", journal_mode="off")
    assert not (tmp_path / "other" / "jobs.db").exists()


def test_a_store_held_open_in_wal_mode_is_not_waited_for(tmp_path, caplog):
    """A process wanting DELETE while another holds the store open in WAL does not hang on
    the lock (SQLite can leave WAL only when alone): it goes on in WAL and says so once."""
    import time

    root = tmp_path / "store"
    holder = JobStore(root, journal_mode="wal")
    holder.list_jobs()  # its connection stays open
    caplog.set_level(logging.WARNING, logger="jupyterlab_mlcluster.store")
    started = time.monotonic()
    others = [JobStore(root, journal_mode="delete") for _ in range(3)]
    assert time.monotonic() - started < 10
    assert [o.list_jobs() for o in others] == [([], 0)] * 3
    said = [r.getMessage() for r in caplog.records if "stays in journal mode wal" in r.getMessage()]
    assert len(said) == 1, said
    for store in [holder, *others]:
        store.close()
    assert _journal(JobStore(root, journal_mode="delete")) == "delete"  # alone now: it leaves
