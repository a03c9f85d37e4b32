"""The cell monitor's curves (kernel/curves.py): a series folded into bounded buckets, drawn
with at most two points per pixel column that keep its extremes, the ranks' mean with a
min–max band above MAX_RANK_LINES ranks, and series names as text only (a real kernel)."""

from __future__ import annotations

import json
import math
import re

import pytest

from jupyterlab_mlcluster.kernel import curves
from jupyterlab_mlcluster.kernel.curves import Curves, Track, column_minmax, nice_ticks


def write_series(job_dir, batches):
    with open(job_dir / "series.jsonl", "a") as f:
        for rank, points in batches:
            f.write(json.dumps({"r": rank, "p": points}) + "\n")


def test_a_long_series_is_kept_in_bounded_buckets_that_keep_its_extremes():
    track = Track()
    steps = list(range(100_000))
    values = [math.sin(s / 500) for s in steps]
    values[77_777] = 50.0  # one spike among 100,000 points
    for i in range(0, len(steps), 2000):  # as the batches come
        track.add(steps[i : i + 2000], values[i : i + 2000])
    assert track.raw is None and len(track.buckets) <= curves.MAX_BUCKETS
    assert track.count == 100_000 and track.hi == 50.0 and track.last == values[-1]
    drawn = column_minmax(track.extremes(), 0, 99_999, curves.PLOT_WIDTH)
    assert len(drawn) <= 2 * curves.PLOT_WIDTH
    assert (77_777, 50.0) in drawn  # the spike is drawn, where it was
    assert [s for s, _ in drawn] == sorted(s for s, _ in drawn)
    assert min(v for _, v in drawn) == min(values)


def test_steps_in_order_fold_into_the_buckets_a_point_at_a_time_makes():
    """Steps in order (a stored run's first draw) are folded a bucket's run at a time; the
    buckets are those of the point-at-a-time fold, through the widths' doublings too."""
    steps = [s * 0.75 for s in range(30_000)]
    values = [math.cos(s / 300) + (s % 7) * 0.01 for s in steps]

    def fold(method: str) -> Track:
        track = Track()
        track.raw, track.width = None, 4.0  # 5,625 buckets at first: coarsened 3 times
        for i in range(0, len(steps), 3000):
            getattr(track, method)(steps[i : i + 3000], values[i : i + 3000])
        return track

    runs, each = fold("_add_runs"), fold("_add_each")
    assert runs.width == each.width == 32.0 and runs.seq == each.seq == 30_000
    assert runs.buckets.keys() == each.buckets.keys()
    for key, b in runs.buckets.items():
        assert b[:6] + b[7:] == each.buckets[key][:6] + each.buckets[key][7:], key
        assert b[6] == pytest.approx(each.buckets[key][6])


def test_few_points_are_drawn_as_they_came():
    drawn = column_minmax([(0, 1.0, 0), (1, 3.0, 1), (2, 2.0, 2)], 0, 2, curves.PLOT_WIDTH)
    assert drawn == [(0, 1.0), (1, 3.0), (2, 2.0)]


def test_nice_ticks_cover_the_values():
    lo, hi, ticks = nice_ticks(-0.01, 1.16)
    assert lo <= -0.01 and hi >= 1.16 and len(ticks) <= 8
    assert nice_ticks(5, 5)[2]  # a flat series still gets an axis


def test_a_series_of_one_point_draws_with_its_integer_step(tmp_path):
    # A stored step comes back from JSON as an int; the step axis of one point has that one
    # tick (Python 3.11's int has no is_integer, so this once failed a job's cell).
    write_series(tmp_path, [(0, [[1000, 0, {"loss": 0.5}]])])
    view = Curves(tmp_path)
    assert view.poll()
    html = view.html()
    assert ">1k</text>" in html and "data-kept='1'" in html


@pytest.mark.slow
def test_ten_thousand_points_draw_at_most_two_per_pixel_column(tmp_path):
    write_series(
        tmp_path,
        [(r, [[s, 0, {"loss": 1 / (s + 1) + r}] for s in range(10_000)]) for r in range(4)],
    )
    view = Curves(tmp_path)
    assert view.poll() and not view.poll()  # the cursor: each point is read once
    html = view.html()
    counts = [int(n) for n in re.findall(r"data-points='(\d+)'", html)]
    assert len(counts) == 4 and all(0 < n <= 2 * curves.PLOT_WIDTH for n in counts), counts
    assert "data-kept='40000'" in html and "data-mode='ranks'" in html
    assert "rank 3" in html


def test_more_ranks_than_lines_draw_the_mean_and_its_band(tmp_path):
    ranks = curves.MAX_RANK_LINES + 1
    write_series(
        tmp_path, [(r, [[s, 0, {"acc": s * 0.01 + r}] for s in range(50)]) for r in range(ranks)]
    )
    view = Curves(tmp_path)
    view.poll()
    html = view.html()
    assert "data-mode='mean'" in html and "mlc-curve-band" in html
    assert "mlc-curve-line" not in html and f"mean of {ranks} ranks" in html
    mean = re.search(r"mlc-curve-mean' points='([^']+)'", html)
    assert mean and len(mean.group(1).split()) == 50
    assert "mlc-curve-line" in view.html("ranks")  # the toggle's "per rank"


CELL = """%%distributed --workers 2
import time, jupyterlab_mlcluster as mlc
for step in range(30):
    mlc.log(step, **{{"loss": 1 / (step + 1), {name!r}: step}})
time.sleep(2.5)
"""


def test_attack_series_names_reach_the_curves_as_text_only(kernel):
    """A series name may hold any printable text: the monitor's SVG escapes it."""
    name = "<img src=x onerror=alert(1)>"
    msgs, reply = kernel.execute(CELL.format(name=name), timeout=120)
    assert reply["status"] == "ok", reply
    shown = []
    for m in msgs:
        if m["msg_type"] == "comm_msg":
            shown.append(m["content"]["data"].get("state", {}).get("value", ""))
        elif m["msg_type"] in ("display_data", "update_display_data", "comm_open"):
            data = m["content"]["data"]
            shown.append(data.get("text/html", "") or data.get("state", {}).get("value", ""))
    html = "\n".join(s for s in shown if isinstance(s, str))
    assert "class='mlc-curve'" in html and "data-series='loss'" in html, html[-3000:]
    assert "data-series='&lt;img src=x onerror=alert(1)&gt;'" in html
    assert not re.search(r"<img\b", html)
