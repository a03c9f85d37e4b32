"""What filesystem holds a path, and what a failed write to it means.

The job store lives in the user's home by default. Two facts about that filesystem change
how the store behaves: whether it is a network filesystem (SQLite's WAL mode is unsafe
there) and, once a write fails, whether it is full (the job's reason must say so, and
readers must keep working). Both are judged here from /proc/self/mountinfo, as pure
functions of its text so that tests can hand in a fabricated one.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import sqlite3
from pathlib import Path

MOUNTINFO = "/proc/self/mountinfo"

# Filesystems whose file locking or shared memory SQLite cannot rely on across hosts. WAL
# needs a -shm file mapped by every connection, which only works when all of them run on one
# host (https://sqlite.org/wal.html, "WAL does not work over a network filesystem"); the
# rollback journal (journal_mode=DELETE) needs only POSIX locks, which these implement
# across clients. Home directories of JupyterHub and HPC sites are very often one of these.
NETWORK_FSTYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ncpfs",
        "afs",
        "9p",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "glusterfs",
        "ocfs2",
        "gfs2",
        "pvfs2",
        "orangefs",
        "wekafs",
        "fuse.sshfs",
        "fuse.glusterfs",
        "fuse.cephfs",
        "fuse.ceph-fuse",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "fuse.rclone",
        "fuse.juicefs",
        "fuse.beegfs",
    }
)

# SQLite reports a -shm file it cannot grow as a generic I/O error, not as "full": an I/O
# error while the filesystem has less than this left is taken for a full disk.
LOW_SPACE_BYTES = 1 << 20
_SQLITE_FULL = 13
_SQLITE_IOERR = 10


@dataclasses.dataclass(frozen=True)
class Mount:
    mount_point: str
    fstype: str
    source: str

    @property
    def network(self) -> bool:
        return self.fstype in NETWORK_FSTYPES


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a /proc/<pid>/mountinfo text, in its order (later ones mount over
    earlier ones at the same point). Lines that do not parse are skipped."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        try:
            sep = fields.index("-", 6)
            mounts.append(Mount(_unescape(fields[4]), fields[sep + 1], _unescape(fields[sep + 2])))
        except (ValueError, IndexError):
            continue
    return mounts


def mount_of(path: str | os.PathLike[str], mountinfo: str) -> Mount | None:
    """The mount holding `path` (resolved through links; it need not exist yet): the
    longest mount point above it, the last one listed on a tie."""
    target = os.path.realpath(path)
    best: Mount | None = None
    for mount in parse_mountinfo(mountinfo):
        point = mount.mount_point.rstrip("/") or "/"
        inside = target == point or target.startswith(point if point == "/" else point + "/")
        if inside and (best is None or len(point) >= len(best.mount_point.rstrip("/") or "/")):
            best = mount
    return best


def read_mountinfo(source: str | os.PathLike[str] | None = None) -> str:
    """The text of `source` (default: this process's mountinfo); '' if it cannot be read
    (not Linux): then nothing is taken for a network filesystem."""
    try:
        return Path(source or MOUNTINFO).read_text()
    except OSError:
        return ""


def is_storage_full(exc: BaseException, path: str | os.PathLike[str]) -> bool:
    """Did `exc` (an OSError or an SQLite error) come from a full disk or quota under
    `path`?"""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if isinstance(exc, sqlite3.Error):
        code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
        if code == _SQLITE_FULL or "database or disk is full" in str(exc):
            return True
        if code != _SQLITE_IOERR and "disk I/O error" not in str(exc):
            return False
    elif not isinstance(exc, OSError):
        return False
    return free_bytes(path) < LOW_SPACE_BYTES


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Space an unprivileged writer may still use under `path` (a huge number if unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return 1 << 62
    return st.f_bavail * st.f_frsize


def no_space_text(path: str | os.PathLike[str], mountinfo: str | None = None) -> str:
    """'no space left on <device> mounted at <mount point> (writing <path>)': the reason a
    job gets when its store's filesystem is full."""
    info = read_mountinfo() if mountinfo is None else mountinfo
    mount = mount_of(path, info)
    if mount is None:
        return f"no space left on the device holding {path}"
    return (
        f"no space left on {mount.source} ({mount.fstype}) mounted at {mount.mount_point}"
        f" (writing {path})"
    )
