"""logfiles.tail_offset against a naive reference, over fixed seeds."""

from __future__ import annotations

import io
import random

import pytest

from jupyterlab_mlcluster.jobs.storage import logfiles


def naive_tail_offset(data: bytes, lines: int) -> int:
    """Just after the (lines+1)th newline from the end; 0 if there are not that many."""
    if lines <= 0:
        return len(data)
    newlines = [i for i, byte in enumerate(data) if byte == ord("\n")]
    if len(newlines) <= lines:
        return 0
    return newlines[-(lines + 1)] + 1


def random_log(rng: random.Random, line_count: int, crlf: bool, trailing_newline: bool) -> bytes:
    parts = []
    for _ in range(line_count):
        length = rng.choice([0, 0, 1, 5, 80, rng.randint(0, 300), rng.randint(0, 140_000)])
        text = bytes(rng.choice(b"abc \t\r\xff") for _ in range(min(length, 50))) * (
            length // 50 + 1
        )
        parts.append(text[:length] + (b"\r\n" if crlf else b"\n"))
    data = b"".join(parts)
    if not trailing_newline:
        data += b"partial line without newline"
    return data


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12))
def test_tail_offset_matches_naive_reference(seed):
    rng = random.Random(seed)
    data = random_log(
        rng,
        line_count=rng.randint(0, 60),
        crlf=bool(seed % 2),
        trailing_newline=bool(seed % 3),
    )
    total = data.count(b"\n")
    f = io.BytesIO(data)
    for n in sorted({0, 1, 2, 3, total - 1, total, total + 1, total + 50, rng.randint(0, 80)}):
        expected = naive_tail_offset(data, n)
        assert logfiles.tail_offset(f, n, max_bytes=None) == expected, (seed, n)
        # A cap wider than the file changes nothing.
        assert logfiles.tail_offset(f, n, max_bytes=len(data) + 1) == expected, (seed, n)
        if n > 0 and expected < len(data):
            # CRLF untouched: the tail is the file's own bytes from a line start.
            assert expected == 0 or data[expected - 1 : expected] == b"\n"


@pytest.mark.parametrize("seed", range(8))
def test_tail_offset_byte_cap(seed):
    rng = random.Random(1000 + seed)
    data = random_log(
        rng, line_count=rng.randint(1, 60), crlf=bool(seed % 2), trailing_newline=True
    )
    cap = rng.randint(1, max(1, len(data)))
    n = rng.randint(1, 80)
    got = logfiles.tail_offset(io.BytesIO(data), n, max_bytes=cap)
    window = len(data) - cap
    uncapped = naive_tail_offset(data, n)
    if uncapped >= window:
        assert got == uncapped  # the tail fits in the cap: same answer
    else:
        # The first line that begins inside the window (or the end if none does).
        first = data.find(b"\n", window)
        expected = first + 1 if first >= 0 else len(data)
        assert got == expected
        assert got >= window


def test_tail_offset_empty_and_lines_without_text():
    assert logfiles.tail_offset(io.BytesIO(b""), 5) == 0
    assert logfiles.tail_offset(io.BytesIO(b"\n\n\n"), 2) == 1
    assert logfiles.tail_offset(io.BytesIO(b"\n\n\n"), 0) == 3
