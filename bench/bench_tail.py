"""Time of finding where a log's tail starts: the old algorithm against jobs/storage/logfiles.py's.

    python bench/bench_tail.py [--sizes 10,20,40] [--runs 3]

For each size (MB) a log of random-length lines (empty ones included) is written once, then
each method looks for more lines than the file has, the worst case (it scans the whole file,
or up to the byte cap):
  old          the previous tail_offset: re-joined its buffer and recounted every newline at
               each 64 KiB step (quadratic in the file size)
  new-uncapped logfiles.tail_offset(max_bytes=None): blocks scanned backwards, each block's
               newlines counted once
  new          logfiles.tail_offset with its default byte cap (TAIL_MAX_BYTES)
Medians over --runs runs, all methods in the same process and run.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time

from jupyterlab_mlcluster.jobs.storage import logfiles


def old_tail_offset(f, lines: int) -> int:
    """The algorithm logfiles.tail_offset replaced, kept here only to compare with."""
    f.seek(0, os.SEEK_END)
    size = f.tell()
    if lines <= 0:
        return size
    block, pos, found, data = 65536, size, 0, b""
    while pos > 0 and found <= lines:
        step = min(block, pos)
        pos -= step
        f.seek(pos)
        data = f.read(step) + data
        found = data.count(b"\n")
    if found <= lines:
        return 0
    idx = -1
    for _ in range(found - lines):
        idx = data.index(b"\n", idx + 1)
    return pos + idx + 1


def write_log(path: str, megabytes: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    target = megabytes * 1024 * 1024
    written = lines = 0
    with open(path, "wb") as f:
        while written < target:
            text = "x" * rng.choice([0, 10, 60, 120, 400])
            raw = logfiles.format_log_line(1.7e9 + lines, "o", text)
            f.write(raw)
            written += len(raw)
            lines += 1
    return lines


def timed(fn, path: str, lines: int, runs: int) -> tuple[float, int]:
    times, result = [], None
    for _ in range(runs):
        with open(path, "rb") as f:
            start = time.perf_counter()
            result = fn(f, lines)
            times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,20,40", help="log sizes in MB, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    methods = {
        "old": old_tail_offset,
        "new-uncapped": lambda f, n: logfiles.tail_offset(f, n, max_bytes=None),
        "new": logfiles.tail_offset,
    }
    print(f"{'size':>6} {'lines':>9} " + " ".join(f"{m + ' s':>15}" for m in methods))
    with tempfile.TemporaryDirectory() as tmp:
        for mb in (int(s) for s in args.sizes.split(",")):
            path = os.path.join(tmp, f"{mb}.log")
            line_count = write_log(path, mb)
            row, results = [], {}
            for name, fn in methods.items():
                seconds, results[name] = timed(fn, path, line_count + 10, args.runs)
                row.append(f"{seconds:>15.4f}")
            # Same answer without the cap, so the speed is not bought with a different result.
            assert results["old"] == results["new-uncapped"], results
            print(f"{mb:>4}MB {line_count:>9} " + " ".join(row), flush=True)
            os.unlink(path)


if __name__ == "__main__":
    main()
