"""The store's root directory: whose it may be (check_store_root), and the reserve it keeps
for a full disk (Reserve)."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from ...runtime.atomic import write_whole
from .database import Database

# Space kept for the store's last words: a file of this size in the store's root that a
# supervisor deletes when its disk is full, so that its job's failure (and its ranks' end)
# can still be written and every reader sees the job end, instead of a job listed running
# until someone frees space. Made again by the next store opened with room for it.
RESERVE_NAME = "reserve"
RESERVE_BYTES = 256 * 1024


class UnsafeStore(PermissionError):
    """A store root someone else owns or may write: opening it would trust their files (the
    jobs' payloads, results and keys). The message says what to do."""


def check_store_root(root: Path) -> None:
    """Refuse a store root this user does not own, or one others may write (a directory an
    attacker made first, where this user's jobs would land; a world-writable one). Its own
    primary group may write it (shared-group homes such as Jupyter's docker stacks)."""
    info = os.stat(root)
    me = os.geteuid()
    if info.st_uid != me:
        raise UnsafeStore(
            f"the job store {root} belongs to uid {info.st_uid}, not to you (uid {me}): its "
            "owner could read and change your jobs. Use a directory of your own "
            "(MLCLUSTER_STORE_DIR or MLClusterConfig.store_dir)"
        )
    loose = info.st_mode & 0o002 or (info.st_mode & 0o020 and info.st_gid != os.getegid())
    if loose:
        raise UnsafeStore(
            f"the job store {root} may be written by other users (mode "
            f"{stat.S_IMODE(info.st_mode):o}): they could change your jobs. `chmod 700 {root}`, "
            "or use a directory of your own (MLCLUSTER_STORE_DIR or MLClusterConfig.store_dir)"
        )


class Reserve:
    """The reserve file of one store's root (none is made while `database` is read-only)."""

    def __init__(self, root: Path, database: Database):
        self.root = root
        self.database = database

    def keep(self) -> None:
        """Make the reserve (RESERVE_NAME) if it is missing and there is room; a full disk
        leaves it missing until a later call."""
        path = self.root / RESERVE_NAME
        if self.database.read_only or path.exists():
            return
        # Zeros written, not a sparse file: real blocks, whose deletion gives space back. A
        # full disk leaves neither the reserve nor write_whole's temporary file.
        with contextlib.suppress(OSError):
            write_whole(path, bytes(RESERVE_BYTES), mode=0o600)

    def release(self) -> bool:
        """Give the reserve's space back (a full disk); True if there was one to give."""
        try:
            (self.root / RESERVE_NAME).unlink()
        except OSError:
            return False
        return True
