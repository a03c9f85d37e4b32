"""`breakpoint()` in a session's cell: the rank pauses in a live pdb.

pdb's stdin and stdout are a `debugger.FileRelay`, as for a post-mortem, over two files this
rank makes (O_EXCL, 0600) in a 0700 directory of the cell's job directory, named
`pause-<rank>-<random>` once complete (made under a hidden name, then renamed, so that
whoever lists the job directory never sees half of one). A pod's rank has no such
directory: its `pdb_relay.ChannelRelay` says the same records, and its supervisor makes the
directory (backends/kubernetes/session_pdb.py). Its first record says where the
rank paused; the notebook that waits on the cell (or `mlcluster session debug`) claims it
and relays the prompt (jobs/session_debug.py). The other ranks are not told: they wait where
their code waits for this one (a collective, or the cell's end).

`c`, `q`, the end of input or nobody typing for `debugger.IDLE_LIMIT` resume the rank (a
`q` that raised BdbQuit would fail the cell: leaving pdb means going on). An interrupt (the
cell's, from the notebook) leaves pdb and ends the cell as interrupted. pdb stops only in
the cell's own frames, never in the runtime's around it, and never outlives the cell.
"""

from __future__ import annotations

import contextlib
import os
import pdb
import secrets
import shutil
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from .pdb_relay import ChannelRelay, FileRelay

_RUNTIME = __name__.rpartition(".")[0] + "."  # this package's frames are not the cell's

PREFIX = "pause-"  # pause-<rank>-<random>: a complete pause directory


class Pause:
    def __init__(
        self,
        directory: str | None,
        relay: FileRelay | ChannelRelay,
        rank: int,
        caller: Any,
        on_end: Callable[[Pause], None],
    ):
        # caller: the runtime's frame that runs the cell's code (the cell's last expression
        # is evaluated apart from the rest, from the same frame).
        self.directory, self.relay, self.rank, self.caller = directory, relay, rank, caller
        self.on_end, self.ended = on_end, False
        self.debugger = LivePdb(self)

    @classmethod
    def open(
        cls,
        job_dir: str | None,
        frame: FrameType,
        caller: Any,
        on_end: Callable[[Pause], None],
    ) -> Pause:
        """A pause at `frame` (OSError: its link could not be made); `job_dir` None: over
        the rank's channels (a pod's)."""
        rank = int(os.environ.get("RANK", "0"))
        where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
        token = secrets.token_hex(8)
        if job_dir is None:
            channel = ChannelRelay(token)
            try:
                channel.send(paused={"rank": rank, "where": where})
            except OSError:
                channel.close()
                raise
            _said(rank, where)
            return cls(None, channel, rank, caller, on_end)
        staging = os.path.join(job_dir, f".{PREFIX}{rank}-{token}")
        try:
            os.mkdir(staging, 0o700)
            for part in ("in", "out"):
                flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW
                os.close(os.open(os.path.join(staging, part), flags, 0o600))
            relay = FileRelay(staging)
            relay.send(paused={"rank": rank, "where": where})
            directory = os.path.join(job_dir, f"{PREFIX}{rank}-{token}")
            os.rename(staging, directory)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        _said(rank, where)
        return cls(directory, relay, rank, caller, on_end)

    def in_cell(self, frame: FrameType | None) -> bool:
        """`frame` is the cell's code (its own or what it called), not the runtime's."""
        if frame is None or str(frame.f_globals.get("__name__", "")).startswith(_RUNTIME):
            return False
        while frame is not None:
            if frame is self.caller:
                return True
            frame = frame.f_back
        return False

    def end(self, how: str) -> None:
        """pdb is left (`how`: resumed, interrupted, the cell ended): tracing stops, the
        other end hears it, the link's files go."""
        if self.ended:
            return
        self.ended = True
        self.on_end(self)
        sys.settrace(None)
        with contextlib.suppress(OSError):
            self.relay.send(resumed=how)
        self.relay.close()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
        self.caller = None  # (its frame's locals go with it)
        print(f"mlcluster: rank {self.rank} left pdb ({how})", file=sys.stderr, flush=True)


def _said(rank: int, where: str) -> None:
    print(
        f"mlcluster: rank {rank} paused at {where} (breakpoint()): its pdb prompt opens"
        f" below the cell that waits on it, or with `mlcluster session debug --rank {rank}`",
        file=sys.stderr,
        flush=True,
    )


class LivePdb(pdb.Pdb):
    def __init__(self, pause: Pause):
        # nosigint: an interrupt is the cell's (session_worker.py's handler), not pdb's.
        super().__init__(stdin=pause.relay, stdout=pause.relay, nosigint=True)  # type: ignore[arg-type]
        self.pause, self.leaving = pause, False
        self.prompt = f"(Pdb rank {pause.rank}) "

    def stop_here(self, frame: FrameType) -> bool:
        return super().stop_here(frame) and self.pause.in_cell(frame)

    def set_continue(self) -> None:
        super().set_continue()
        self.leaving = not self.breaks  # no breakpoint left to stop at: pdb is done

    def set_quit(self) -> None:  # q, exit, end of input: leaving pdb resumes the rank
        self.clear_all_breaks()
        self.set_continue()

    def _cmdloop(self) -> None:
        # (pdb's own catches KeyboardInterrupt and asks again: here it leaves pdb.)
        self.cmdloop()

    def interaction(self, frame: Any, traceback: Any) -> None:
        self.leaving = False
        try:
            super().interaction(frame, traceback)
        except KeyboardInterrupt:
            self.pause.end("interrupted")
            raise
        if self.leaving:
            self.pause.end("resumed")
