"""pdb on a session's rank, from the notebook or a terminal (`mlcluster session debug`).

A post-mortem (`%distributed_debug`): on the traceback of the session's last failed cell.
The debugger runs as a cell of the session (so interrupting it, cancelling it and the
session's own end work as for any cell): on the chosen rank, pdb inspects the exception that
rank kept (runtime/debugger.py) with its stdin and stdout on two files in a directory of the
session's (the user's store, mode 0700; a pod's supervisor mirrors them:
backends/kubernetes/session_pdb.py); here each line pdb prints is said, and each time it
waits for a line the caller is asked (the kernel's input request, or the terminal). Leaving
pdb (`q`, `c`, end of input) ends the cell; the session and its ranks' state are kept.

A live pause (`breakpoint()` in a session cell, runtime/live_pause.py): the rank makes the
same pair of files in a `pause-*` directory of the running cell's; `attend` claims it (one
attendant: the notebook waiting on the cell, kernel/debug_magic.py, or `mlcluster session
debug`) and relays the prompt the same way until pdb is left and the rank goes on. A link
whose files are not this user's own, or that others could write, is refused, never used.

Bad use changes nothing: an unknown session, a rank out of range, a session without a failed
cell (nor a paused rank) are refused before any cell is sent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import stat
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..runtime.debugger import open_private
from ..runtime.live_pause import PREFIX
from .model import JobState
from .sessions import SessionError, get_session, list_sessions, submit_cell

if TYPE_CHECKING:
    from .record import JobRecord
    from .service import JobService

POLL = 0.05


def last_failed_cell(service: JobService, holder: JobRecord) -> JobRecord | None:
    """The session's last failed cell (a debugger's own cells aside)."""
    for cell_id in reversed(service.store.session_cells(holder.id, [str(JobState.FAILED)])):
        cell = service.store.get_job(cell_id)
        if not cell.origin.get("debug_of"):
            return cell
    return None


def debug(
    service: JobService,
    owner: str | None,
    name: str | None,
    rank: int | None,
    *,
    origin: dict,
    ask: Callable[[str], str],
    say: Callable[[str], None],
) -> str:
    """Run pdb on `rank` (default: the rank that failed first) of session `name`'s last
    failed cell until it is left; what to say at the end. SessionError: bad use. `name`
    None: the user's only live session."""
    if name is None:
        live = [info.name for info in list_sessions(service, owner)]
        if len(live) != 1:
            raise SessionError(
                "which session? name it (--session NAME): "
                + (f"the live ones are {', '.join(live)}" if live else "there is no live session")
                + "; a debugger on a rank needs a session (%%distributed --session NAME)"
            )
        name = live[0]
    info = get_session(service, owner, name)
    holder = info.holder
    if rank is not None and not 0 <= rank < holder.spec.workers:
        raise SessionError(
            f"--rank {rank}: session {name!r} has ranks 0 to {holder.spec.workers - 1}"
        )
    elsewhere: list[Pause] = []
    for running in service.store.session_cells(holder.id, [str(JobState.RUNNING)]):
        attended, others = attend(service, running, ask, say, rank=rank, interrupt_resumes=True)
        elsewhere += others
        if attended:
            return "the rank goes on; the session and its state are kept"
    if elsewhere:
        raise SessionError(
            ", ".join(f"rank {p.rank} (paused at {p.where})" for p in elsewhere)
            + ": its pdb prompt is open elsewhere already (the notebook waiting on the cell)"
        )
    failed = last_failed_cell(service, holder)
    if failed is None:
        raise SessionError(
            f"session {name!r} has no failed cell to debug, and no rank paused at a breakpoint()"
        )
    if rank is None:
        rank = failed.failed_rank if failed.failed_rank is not None else 0
    directory = _relay_directory(service, holder)
    from ..runtime.payload import Payload

    source = (
        '__import__("jupyterlab_mlcluster.runtime.debugger", fromlist=["_"])'
        f".relay_post_mortem({rank}, {failed.id!r}, {directory!r})\n"
    )
    record, _ = submit_cell(
        service,
        name,
        {"name": f"debug-rank{rank}"},
        Payload(kind="code", source=source, cwd=os.getcwd()),
        origin={**origin, "debug_of": failed.id},
    )
    say(f"pdb on rank {rank}, at the failure of cell {failed.name} ({failed.id}):\n")
    try:
        return _relay(service, record.id, directory, ask, say)
    finally:
        for part in ("in", "out"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, part))
        with contextlib.suppress(OSError):
            os.rmdir(directory)


def _relay_directory(service: JobService, holder: JobRecord) -> str:
    base = service.store.job_dir(holder.id) / "debug"
    base.mkdir(mode=0o700, exist_ok=True)
    directory = base / secrets.token_hex(8)
    directory.mkdir(mode=0o700)
    for part in ("in", "out"):
        os.close(os.open(directory / part, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    return str(directory)


@dataclasses.dataclass(frozen=True)
class Pause:
    """A rank paused at a breakpoint(): its pdb link (runtime/live_pause.py)."""

    directory: str
    rank: int
    where: str


def paused_ranks(job_dir: str, seen: set[str], refused: Callable[[str], None]) -> list[Pause]:
    """The ranks of the cell of `job_dir` paused at a breakpoint() now (not in `seen`, to
    which each is added), by rank. A link that is not a private directory and files of this
    user is refused (said to `refused`) and never used: whoever writes its input drives pdb,
    and what is typed there goes to its input."""
    found = []
    with contextlib.suppress(FileNotFoundError), os.scandir(job_dir) as entries:
        for entry in entries:
            if not entry.name.startswith(PREFIX) or entry.path in seen:
                continue
            seen.add(entry.path)
            try:
                info = os.lstat(entry.path)
                if (
                    not stat.S_ISDIR(info.st_mode)
                    or info.st_uid != os.getuid()
                    or info.st_mode & 0o077
                ):
                    raise PermissionError(f"{entry.path}: not a private directory of this user")
                for part in ("in", "out"):  # (both: the one typed into, the one shown)
                    os.close(open_private(os.path.join(entry.path, part), os.O_RDONLY))
                with open(os.path.join(entry.path, "out"), "rb") as out:
                    paused = json.loads(out.readline())["paused"]
                found.append(Pause(entry.path, int(paused["rank"]), str(paused["where"])))
            except FileNotFoundError:
                continue  # (the pause ended meanwhile)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                refused(f"refused a paused rank's pdb link: {exc}\n")
    return sorted(found, key=lambda p: (p.rank, p.directory))


def attend(
    service: JobService,
    cell_id: str,
    ask: Callable[[str], str],
    say: Callable[[str], None],
    *,
    rank: int | None = None,
    seen: set[str] | None = None,
    interrupt_resumes: bool = False,
) -> tuple[int, list[Pause]]:
    """pdb's prompt on each rank of cell `cell_id` paused at a breakpoint() (only `rank`'s,
    if given), one at a time, each until pdb is left: (how many, those whose prompt someone
    else holds). `interrupt_resumes`: an interrupt of `ask` resumes the rank first (a
    terminal's; a notebook's interrupts the cell instead)."""
    attended, elsewhere = 0, []
    for pause in paused_ranks(
        str(service.store.job_dir(cell_id)), set() if seen is None else seen, say
    ):
        if rank is not None and pause.rank != rank:
            continue
        try:
            os.close(os.open(os.path.join(pause.directory, "claim"), _CLAIM, 0o600))
        except FileExistsError:
            elsewhere.append(pause)
            continue
        except FileNotFoundError:
            continue  # (it ended meanwhile)
        say(f"rank {pause.rank} paused at {pause.where} (breakpoint()); `c` resumes it:\n")
        _relay(service, cell_id, pause.directory, ask, say, live=pause, resumes=interrupt_resumes)
        say(f"rank {pause.rank} goes on\n")
        attended += 1
    return attended, elsewhere


_CLAIM = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW


def _relay(
    service: JobService,
    cell_id: str,
    directory: str,
    ask: Callable[[str], str],
    say: Callable[[str], None],
    *,
    live: Pause | None = None,
    resumes: bool = False,
) -> str:
    """Relay pdb's prompt in `directory` until it is left. `live`: a paused rank's (its
    files the rank's: checked; its end is the rank going on, or its cell ending)."""
    if live is None:
        typed = os.open(os.path.join(directory, "in"), os.O_WRONLY | os.O_APPEND)
        out = os.open(os.path.join(directory, "out"), os.O_RDONLY)
    else:
        typed = open_private(os.path.join(directory, "in"), os.O_WRONLY | os.O_APPEND)
        out = open_private(os.path.join(directory, "out"), os.O_RDONLY)
    link = _Link(ask, say, live, resumes, typed)
    try:
        with os.fdopen(out, "rb") as reader:
            buffered = b""
            while not link.ended:
                chunk = reader.read()
                if not chunk:
                    record = service.store.get_job(cell_id)
                    if record.final:
                        if live is None and record.state != JobState.SUCCEEDED:
                            reason = record.error or record.reason or str(record.state)
                            raise SessionError(f"the debugger's cell ended: {reason}")
                        break
                    time.sleep(POLL)
                    continue
                buffered += chunk
                while b"\n" in buffered:
                    line, _, buffered = buffered.partition(b"\n")
                    link.take(json.loads(line))
    except BaseException:
        # (A kernel's interrupt, a refused cell: pdb must not wait for lines nobody types.
        # A live pause's cell is the caller's to interrupt.)
        if live is None:
            with contextlib.suppress(Exception):
                service.cancel(cell_id, wait=False)
        raise
    finally:
        os.close(typed)
    if live is not None:
        return ""
    service.wait(cell_id, timeout=60)
    if link.error:
        raise SessionError(link.error)
    return "left pdb; the session and its state are kept"


class _Link:
    """One relayed pdb: its records ({"out": text}, {"ask": true}, {"error": text},
    {"end": true}) said, asked and answered."""

    def __init__(
        self,
        ask: Callable[[str], str],
        say: Callable[[str], None],
        live: Pause | None,
        resumes: bool,
        typed: int,
    ):
        self.ask, self.say, self.live, self.resumes, self.typed = ask, say, live, resumes, typed
        self.pending = ""  # what pdb printed since its last newline: the prompt, when it asks
        self.error: str | None = None
        self.ended = False

    def take(self, message: dict) -> None:
        if "out" in message:
            text = self.pending + message["out"]
            done, _, self.pending = text.rpartition("\n")
            if done:
                self.say(done + "\n")
        elif message.get("ask"):
            answer = _answer(self.ask, self.say, self.pending, self.live, self.resumes, self.typed)
            self.pending = ""
            os.write(self.typed, answer.replace("\n", " ").encode() + b"\n")
        elif "error" in message:
            self.error = str(message["error"])
        elif message.get("end"):
            self.ended = True


def _answer(
    ask: Callable[[str], str],
    say: Callable[[str], None],
    prompt: str,
    live: Pause | None,
    resumes: bool,
    typed: int,
) -> str:
    """The line typed at `prompt`; leaving pdb's when there is none: the end of input, an
    interrupt (a post-mortem's), a frontend that cannot ask (IPython's
    StdinNotImplementedError: a kernel run without stdin), which is said."""
    leave = "q" if live is None else "c"
    try:
        return ask(prompt)
    except EOFError:
        return leave
    except NotImplementedError as exc:
        if live is None:
            raise
        say(
            f"rank {live.rank}: pdb's prompt cannot open here ({exc}); the rank goes on"
            f" (`mlcluster session debug --rank {live.rank}` opens it in a terminal at its"
            " next breakpoint())\n"
        )
        return leave
    except KeyboardInterrupt:
        if live is None:
            return leave
        if resumes:
            with contextlib.suppress(OSError):
                os.write(typed, b"c\n")
        raise
