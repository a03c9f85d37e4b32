"""runtime/atomic.py, the package's one temporary-file-and-rename, on real files."""

from __future__ import annotations

import os

import pytest

from jupyterlab_mlcluster.runtime.atomic import drop_leftovers, temporary_name, write_whole


def test_a_write_that_must_not_replace_keeps_the_first_writers_file(tmp_path):
    path = tmp_path / "record.json"
    write_whole(path, "first", replace=False)
    with pytest.raises(FileExistsError):
        write_whole(path, "second", replace=False)
    assert path.read_text() == "first"
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def test_leftovers_of_any_writer_go_and_nothing_else(tmp_path):
    kept = ["result.pkl", "notes.tmp", ".hidden", "result.pkl.tmp"]
    for name in kept:
        (tmp_path / name).write_text("x")
    ours = temporary_name(str(tmp_path / "result.pkl"))
    theirs = ours.replace(f".{os.getpid()}.", ".4194304.")
    for leftover in (ours, theirs):
        with open(leftover, "w") as f:
            f.write("half")
    drop_leftovers(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
