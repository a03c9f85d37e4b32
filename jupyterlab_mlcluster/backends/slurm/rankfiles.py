"""What the ranks of one Slurm attempt write on the shared filesystem, read as it grows:
each rank's output, error and control (report) files and its exit file, in the attempt's
directory (script.rank_file names them), and the batch script's own output."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...runtime.protocol import OutputParser
from . import script

READ_CAP = 1 << 20  # bytes read from one rank file per turn
SCAN_EVERY = 0.05  # seconds between looks at the rank files, per 8 ranks
SCAN_MAX = 1.0

Items = Iterator[tuple[str, Any]]  # what an OutputParser makes of the bytes it is fed


class _RankFile:
    """One rank's output, report or exit file, read as it grows."""

    def __init__(self, path: str):
        self.path = path
        self.offset = 0

    def read(self) -> bytes:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(READ_CAP)
        except FileNotFoundError:
            return b""
        self.offset += len(data)
        return data


class RankFiles:
    """Every rank's files of one attempt, each stream with its parser (the control stream's
    checks the job's `key`: only a record the rank signed is a report).

    Each look opens every rank's files afresh (on NFS only an open revalidates a file:
    close-to-open consistency), so a big job is looked at less often (SCAN_EVERY per 8
    ranks, at most SCAN_MAX apart) not to flood the shared filesystem's server.
    """

    def __init__(self, attempt_dir: Path, workers: int, key: bytes):
        self.dir = attempt_dir
        self.files: dict[tuple[int, str], _RankFile] = {}
        self.parsers: dict[tuple[int, str], OutputParser] = {}
        for rank in range(workers):
            for stream, suffix in script.RANK_STREAMS.items():
                self.files[(rank, stream)] = _RankFile(
                    script.rank_file(str(attempt_dir), rank, suffix)
                )
                self.parsers[(rank, stream)] = OutputParser(key if stream == "c" else None, rank)
        self.last_scan = float("-inf")
        self.scan_interval = min(SCAN_MAX, SCAN_EVERY * max(1.0, workers / 8))

    def due(self, force: bool = False) -> bool:
        """Whether a look is due now (`force`: it is); saying so starts the look."""
        now = time.monotonic()
        if not force and now - self.last_scan < self.scan_interval:
            return False
        self.last_scan = now
        return True

    def news(self) -> Iterator[tuple[int, str, Items]]:
        """What each rank's files gained since the last look: (rank, stream, items)."""
        for (rank, stream), f in self.files.items():
            data = f.read()
            if data:
                yield rank, stream, self.parsers[(rank, stream)].feed(data)

    def rest(self, rank: int) -> Iterator[tuple[str, Items]]:
        """All that one rank's files still hold (after its exit: what it wrote last)."""
        for stream in script.RANK_STREAMS:
            f, parser = self.files[(rank, stream)], self.parsers[(rank, stream)]
            while data := f.read():
                yield stream, parser.feed(data)

    def exit_code(self, rank: int) -> int | None:
        """The rank's exit status, once its exit file is written."""
        try:
            return int(Path(script.rank_file(str(self.dir), rank, "exit")).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def batch_output(self, limit: int = 16384) -> str:
        """The last `limit` bytes of the batch script's output (srun's messages)."""
        try:
            with open(self.dir / "batch.out", "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - limit))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""
