"""The logged series (`mlc.log`) as curves in the cell monitor: one SVG chart per series, the
step on the x axis, one line per rank or the ranks' mean with a min–max band.

The kernel reads the job's series.jsonl from the store (jobs/storage/series.py) with a
cursor, so each point is read once, and folds it into a Track: a series of one rank kept as
at most MAX_BUCKETS step buckets (min, max, sum, count). A bucket's width is a power of two;
when the buckets grow past MAX_BUCKETS the width doubles and pairs merge. Reading costs O(1)
a point and drawing O(buckets), whatever the length of the run; the points themselves stay
whole in the store (`mlcluster metrics JOB`, GET /jobs/{id}/metrics).

Drawing folds the buckets again into one column per pixel and keeps each column's min and
max in the order they came (a polyline through them looks like the whole series), so a line
has at most 2 * PLOT_WIDTH points. The SVG is plain markup in an HTML widget (or the summary's
HTML): no round trip per point, no JavaScript, and it stays in a saved notebook. Colours
are mid-tones legible on light and dark backgrounds; text and grid use JupyterLab's CSS
variables. Series names come from the job's code: text only (html.escape).
"""

from __future__ import annotations

import bisect
import html
import math
import time
from pathlib import Path
from typing import Any

from ..jobs.storage.series import read_series

CHART_WIDTH = 320
CHART_HEIGHT = 150
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 48, 10, 24, 20
PLOT_WIDTH = CHART_WIDTH - MARGIN_LEFT - MARGIN_RIGHT
PLOT_HEIGHT = CHART_HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
MAX_BUCKETS = 4 * PLOT_WIDTH  # a track's memory, whatever the run's length
RAW_POINTS = MAX_BUCKETS  # points kept as they came before bucketing starts
MAX_RANK_LINES = 8  # "auto": above this many ranks, the mean with a min–max band
MAX_CHARTS = 12
REDRAW_INTERVAL = 1.0  # seconds between redraws of the curves while the job runs
MODES = ("auto", "ranks", "mean")

# Mid-tones: each reads against both a white and a near-black background.
PALETTE = (
    "#1e88e5",
    "#f4511e",
    "#43a047",
    "#8e24aa",
    "#e53935",
    "#00acc1",
    "#fb8c00",
    "#d81b60",
    "#7cb342",
    "#5c6bc0",
)
MEAN_COLOR = "#1e88e5"
TEXT_STYLE = (
    "fill:var(--jp-ui-font-color2, #616161);font-size:10px;"
    "font-family:var(--jp-ui-font-family, sans-serif)"
)
GRID_STYLE = "stroke:var(--jp-border-color2, #e0e0e0);stroke-width:1"


class Track:
    """One rank's series, folded into step buckets: [lo, lo_step, lo_seq, hi, hi_step,
    hi_seq, sum, count] by bucket index (step // width)."""

    def __init__(self) -> None:
        self.raw: list[tuple[float, float]] | None = []  # until RAW_POINTS came
        self.width = 0.0
        self.buckets: dict[int, list[float]] = {}
        self.seq = 0
        self.count = 0
        self.last = math.nan
        self.lo = math.inf
        self.hi = -math.inf
        self.first_step = math.inf
        self.last_step = -math.inf

    def add(self, steps: list[float], values: list[float]) -> None:
        if not steps:
            return
        self.count += len(steps)
        self.last = values[-1]
        self.lo, self.hi = min(self.lo, min(values)), max(self.hi, max(values))
        self.first_step = min(self.first_step, min(steps))
        self.last_step = max(self.last_step, max(steps))
        if self.raw is not None:
            if len(self.raw) + len(steps) <= RAW_POINTS:
                self.raw.extend(zip(steps, values, strict=True))
                return
            raw, self.raw = self.raw, None
            span = max(self.last_step - self.first_step, 1e-300)
            self.width = 2.0 ** math.ceil(math.log2(span / (MAX_BUCKETS / 2)))
            if raw:
                steps = [p[0] for p in raw] + steps
                values = [p[1] for p in raw] + values
        if steps == sorted(steps):
            self._add_runs(steps, values)
        else:
            self._add_each(steps, values)

    def _add_runs(self, steps: list[float], values: list[float]) -> None:
        """Steps in order (the usual): each bucket's run of points found by bisection and
        folded by builtins over its slice, not a Python loop a point (a stored run's first
        draw folds all of it at once)."""
        buckets, seq, i, n = self.buckets, self.seq, 0, len(steps)
        while i < n:
            width = self.width
            key = math.floor(steps[i] / width)
            # (width is a power of two: step / width and (key + 1) * width are exact)
            j = max(bisect.bisect_left(steps, (key + 1) * width, i), i + 1)
            run = values[i:j]
            lo, hi = min(run), max(run)
            lo_at, hi_at = run.index(lo), run.index(hi)
            b = buckets.get(key)
            if b is None:
                buckets[key] = [
                    lo, steps[i + lo_at], seq + 1 + lo_at,
                    hi, steps[i + hi_at], seq + 1 + hi_at,
                    sum(run), j - i,
                ]  # fmt: skip
            else:
                if lo < b[0]:
                    b[0], b[1], b[2] = lo, steps[i + lo_at], seq + 1 + lo_at
                if hi > b[3]:
                    b[3], b[4], b[5] = hi, steps[i + hi_at], seq + 1 + hi_at
                b[6] += sum(run)
                b[7] += j - i
            seq += j - i
            i = j
            if len(buckets) > MAX_BUCKETS:
                self._coarsen()
                buckets = self.buckets
        self.seq = seq

    def _add_each(self, steps: list[float], values: list[float]) -> None:
        buckets, width, seq = self.buckets, self.width, self.seq
        for step, value in zip(steps, values, strict=True):
            seq += 1
            key = math.floor(step / width)
            b = buckets.get(key)
            if b is None:
                buckets[key] = [value, step, seq, value, step, seq, value, 1]
                if len(buckets) > MAX_BUCKETS:
                    self.seq = seq
                    self._coarsen()
                    buckets, width = self.buckets, self.width
                continue
            if value < b[0]:
                b[0], b[1], b[2] = value, step, seq
            elif value > b[3]:
                b[3], b[4], b[5] = value, step, seq
            b[6] += value
            b[7] += 1
        self.seq = seq

    def _coarsen(self) -> None:
        while len(self.buckets) > MAX_BUCKETS:
            self.width *= 2
            merged: dict[int, list[float]] = {}
            for key, b in self.buckets.items():
                m = merged.get(key // 2)
                if m is None:
                    merged[key // 2] = list(b)
                    continue
                if b[0] < m[0]:
                    m[0], m[1], m[2] = b[0], b[1], b[2]
                if b[3] > m[3]:
                    m[3], m[4], m[5] = b[3], b[4], b[5]
                m[6] += b[6]
                m[7] += b[7]
            self.buckets = merged

    def extremes(self) -> list[tuple[float, float, float]]:
        """(step, value, order) of every kept point: the raw points, or each bucket's min
        and max."""
        if self.raw is not None:
            return [(s, v, i) for i, (s, v) in enumerate(self.raw)]
        out = []
        for b in self.buckets.values():
            out.append((b[1], b[0], b[2]))
            if b[5] != b[2]:
                out.append((b[4], b[3], b[5]))
        return out

    def sums(self) -> list[tuple[float, float, float, float, int]]:
        """(step, lo, hi, sum, count) per kept point or bucket, for the ranks' mean."""
        if self.raw is not None:
            return [(s, v, v, v, 1) for s, v in self.raw]
        return [
            ((key + 0.5) * self.width, b[0], b[3], b[6], int(b[7]))
            for key, b in self.buckets.items()
        ]


def column_minmax(
    points: list[tuple[float, float, float]], x0: float, x1: float, columns: int
) -> list[tuple[float, float]]:
    """Downsample for drawing: per pixel column, the min and the max point in the order they
    came, columns left to right; at most 2 * columns (step, value) points."""
    scale = columns / (x1 - x0) if x1 > x0 else 0.0
    cols: dict[int, list[Any]] = {}
    last = columns - 1
    for step, value, order in points:
        c = min(int((step - x0) * scale), last)
        col = cols.get(c)
        if col is None:
            cols[c] = [step, value, order, step, value, order]
            continue
        if value < col[1]:
            col[0], col[1], col[2] = step, value, order
        if value > col[4]:
            col[3], col[4], col[5] = step, value, order
    out: list[tuple[float, float]] = []
    for c in sorted(cols):
        ls, lv, lo, hs, hv, ho = cols[c]
        if lo == ho:
            out.append((ls, lv))
        elif lo < ho:
            out += [(ls, lv), (hs, hv)]
        else:
            out += [(hs, hv), (ls, lv)]
    return out


def column_band(
    tracks: list[Track], x0: float, x1: float, columns: int
) -> list[tuple[float, float, float, float]]:
    """The ranks together, per pixel column: (step, min, mean of the ranks' means, max)."""
    scale = columns / (x1 - x0) if x1 > x0 else 0.0
    last = columns - 1
    cols: dict[int, list[Any]] = {}
    for rank_index, track in enumerate(tracks):
        for step, lo, hi, total, count in track.sums():
            c = min(int((step - x0) * scale), last)
            col = cols.get(c)
            if col is None:
                col = cols[c] = [math.inf, -math.inf, {}]
            col[0], col[1] = min(col[0], lo), max(col[1], hi)
            s, n = col[2].get(rank_index, (0.0, 0))
            col[2][rank_index] = (s + total, n + count)
    out = []
    for c in sorted(cols):
        lo, hi, per_rank = cols[c]
        mean = sum(s / n for s, n in per_rank.values()) / len(per_rank)
        out.append((x0 + (c + 0.5) / scale if scale else x0, lo, mean, hi))
    return out


def number(value: float) -> str:
    if value == 0 or 1e-3 <= abs(value) < 1e5:
        return f"{value:.4g}"
    return f"{value:.2e}"


def tick_text(value: float) -> str:
    value = float(value)  # (a stored step comes back from JSON as an int)
    if value.is_integer() and 1000 <= abs(value) < 1e9:
        return f"{value / 1000:g}k" if abs(value) < 1e6 else f"{value / 1e6:g}M"
    return f"{value:.3g}" if value == 0 or 1e-4 <= abs(value) < 1e5 else f"{value:.0e}"


def nice_ticks(lo: float, hi: float, count: int = 4) -> tuple[float, float, list[float]]:
    """A domain that covers [lo, hi] on round numbers (1, 2 or 5 times a power of ten
    apart), and the ticks on it."""
    if hi <= lo:
        lo, hi = lo - (abs(lo) or 1) * 0.5, hi + (abs(hi) or 1) * 0.5
    raw = (hi - lo) / count
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(f * magnitude for f in (1, 2, 2.5, 5, 10) if f * magnitude >= raw)
    first, last = math.floor(lo / step), math.ceil(hi / step)
    ticks = [k * step for k in range(first, last + 1)]
    return ticks[0], ticks[-1], ticks


class Curves:
    """The series of one job as the kernel shows them; `poll` reads what is new."""

    def __init__(self, job_dir: Path):
        self.job_dir = job_dir
        self.cursor = 0
        self.tracks: dict[str, dict[int, Track]] = {}
        self.points = 0

    def poll(self) -> bool:
        """Read the points stored since the last call, page after page until caught up;
        True if there were any."""
        got, more = False, True
        while more:
            data = read_series(self.job_dir, None, self.cursor)
            self.cursor, more = data["cursor"], data["more"]
            for s in data["series"]:
                track = self.tracks.setdefault(s["name"], {}).setdefault(s["rank"], Track())
                track.add(s["steps"], s["values"])
                self.points += len(s["steps"])
            got = got or bool(data["series"])
        return got

    def html(self, mode: str = "auto") -> str:
        """Every series' chart (the first MAX_CHARTS), '' while none was logged."""
        if not self.tracks:
            return ""
        names = sorted(self.tracks)
        ranks = sorted({r for tracks in self.tracks.values() for r in tracks})
        mean = mode == "mean" or (mode == "auto" and len(ranks) > MAX_RANK_LINES)
        charts = "".join(chart_svg(name, self.tracks[name], mean) for name in names[:MAX_CHARTS])
        more = ""
        if len(names) > MAX_CHARTS:
            more = (
                f"<div style='opacity:0.75'>{len(names) - MAX_CHARTS} more series: "
                "<code>mlcluster metrics JOB</code></div>"
            )
        return (
            f"<div class='mlc-curves' data-mode='{'mean' if mean else 'ranks'}'>"
            f"{legend_html(ranks, mean)}"
            "<div style='display:flex;flex-wrap:wrap;gap:4px 12px'>"
            f"{charts}</div>{more}</div>"
        )


def legend_html(ranks: list[int], mean: bool) -> str:
    style = "font-size:0.85em;color:var(--jp-ui-font-color2, #616161);margin:2px 0"
    if mean:
        swatch = (
            f"<span style='display:inline-block;width:14px;height:8px;background:{MEAN_COLOR};"
            "opacity:0.35;vertical-align:middle'></span>"
        )
        return (
            f"<div class='mlc-curves-legend' style='{style}'>"
            f"<b style='color:{MEAN_COLOR}'>━</b> mean of {len(ranks)} ranks {swatch} min–max</div>"
        )
    items = "".join(
        f"<span style='margin-right:10px;white-space:nowrap'>"
        f"<b style='color:{PALETTE[r % len(PALETTE)]}'>━</b> rank {r}</span>"
        for r in ranks
    )
    return f"<div class='mlc-curves-legend' style='{style}'>{items}</div>"


def chart_svg(name: str, tracks: dict[int, Track], mean: bool) -> str:
    x0 = min(t.first_step for t in tracks.values())
    x1 = max(t.last_step for t in tracks.values())
    y0, y1, yticks = nice_ticks(
        min(t.lo for t in tracks.values()), max(t.hi for t in tracks.values())
    )

    def px(step: float) -> float:
        return MARGIN_LEFT + (PLOT_WIDTH * (step - x0) / (x1 - x0) if x1 > x0 else PLOT_WIDTH / 2)

    def py(value: float) -> float:
        return MARGIN_TOP + PLOT_HEIGHT * (y1 - value) / (y1 - y0)

    def path(points: list[tuple[float, float]]) -> str:
        return " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in points)

    shapes: list[str] = []
    drawn = 0
    ordered = [tracks[r] for r in sorted(tracks)]
    if mean:
        band = column_band(ordered, x0, x1, PLOT_WIDTH)
        drawn = len(band)
        outline = path([(s, hi) for s, _, _, hi in band] + [(s, lo) for s, lo, _, _ in band[::-1]])
        shapes.append(
            f"<polygon class='mlc-curve-band' points='{outline}' "
            f"style='fill:{MEAN_COLOR};fill-opacity:0.3;stroke:none'/>"
        )
        shapes.append(
            f"<polyline class='mlc-curve-mean' points='{path([(s, m) for s, _, m, _ in band])}' "
            f"style='fill:none;stroke:{MEAN_COLOR};stroke-width:1.5'/>"
        )
        last = sum(t.last for t in ordered) / len(ordered)
        last_text = f"mean {number(last)}"
    else:
        for rank in sorted(tracks):
            points = column_minmax(tracks[rank].extremes(), x0, x1, PLOT_WIDTH)
            drawn += len(points)
            color = PALETTE[rank % len(PALETTE)]
            shapes.append(
                f"<polyline class='mlc-curve-line' data-rank='{rank}' data-points='{len(points)}'"
                f" points='{path(points)}' style='fill:none;stroke:{color};stroke-width:1.5;"
                "stroke-linejoin:round'/>"
            )
        first = ordered[0]
        last_text = (
            number(first.last) if len(ordered) == 1 else f"rank {min(tracks)}: {number(first.last)}"
        )
    kept = sum(t.count for t in ordered)
    label = html.escape(name)
    grid = []
    for value in yticks:
        y = py(value)
        grid.append(
            f"<line x1='{MARGIN_LEFT}' x2='{CHART_WIDTH - MARGIN_RIGHT}' y1='{y:.1f}' "
            f"y2='{y:.1f}' style='{GRID_STYLE}'/>"
            f"<text x='{MARGIN_LEFT - 4}' y='{y + 3:.1f}' text-anchor='end' "
            f"style='{TEXT_STYLE}'>{tick_text(value)}</text>"
        )
    bottom = CHART_HEIGHT - 6
    axis = [
        f"<text x='{MARGIN_LEFT - 12}' y='{bottom}' text-anchor='end' style='{TEXT_STYLE}'>"
        "step</text>"
    ]
    xticks = [x for x in nice_ticks(x0, x1, 5)[2] if x0 <= x <= x1] if x1 > x0 else [x0]
    for x in xticks:
        axis.append(
            f"<line x1='{px(x):.1f}' x2='{px(x):.1f}' y1='{MARGIN_TOP + PLOT_HEIGHT}' "
            f"y2='{MARGIN_TOP + PLOT_HEIGHT + 3}' style='{GRID_STYLE}'/>"
            f"<text x='{px(x):.1f}' y='{bottom}' text-anchor='middle' style='{TEXT_STYLE}'>"
            f"{tick_text(x)}</text>"
        )
    title = (
        f"<text x='{MARGIN_LEFT}' y='14' style='fill:var(--jp-ui-font-color1, #212121);"
        "font-size:12px;font-weight:600;font-family:var(--jp-ui-font-family, sans-serif)'>"
        f"{label}<tspan dx='8' style='{TEXT_STYLE}'>{html.escape(last_text)}</tspan></text>"
    )
    return (
        f"<svg class='mlc-curve' data-series='{label}' data-kept='{kept}' data-drawn='{drawn}' "
        f"width='{CHART_WIDTH}' height='{CHART_HEIGHT}' viewBox='0 0 {CHART_WIDTH} {CHART_HEIGHT}'"
        f" role='img' aria-label='{label} over steps {number(x0)} to {number(x1)}'>"
        f"<title>{label}: {kept} points</title>{''.join(grid)}{''.join(axis)}{title}"
        f"{''.join(shapes)}</svg>"
    )


class CurvePanel:
    """The monitor's curves: a mode toggle and the charts, hidden until a series is logged;
    redrawn at most every REDRAW_INTERVAL while the job runs."""

    def __init__(self, curves: Curves):
        import ipywidgets as w

        self.curves = curves
        self.mode = w.ToggleButtons(
            options=[("auto", "auto"), ("per rank", "ranks"), ("mean ± range", "mean")],
            value="auto",
            tooltips=[
                f"one line per rank up to {MAX_RANK_LINES} ranks, then their mean and range",
                "one line per rank",
                "the ranks' mean with a band from their min to their max",
            ],
            style={"button_width": "auto"},
            layout=w.Layout(margin="4px 0 0 0"),
        )
        self.mode.add_class("mlc-curves-mode")
        self.charts = w.HTML()
        self.widget = w.VBox([self.mode, self.charts], layout=w.Layout(display="none"))
        self.widget.add_class("mlc-curves-panel")
        self.last_draw = float("-inf")
        self.dirty = False
        self.mode.observe(lambda _change: self.draw(), names="value")

    def update(self, *, force: bool = False, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if force or now - self.last_draw >= REDRAW_INTERVAL:
            self.dirty = self.curves.poll() or self.dirty
            if self.dirty:
                self.draw(now)

    def draw(self, now: float | None = None) -> None:
        self.last_draw = time.monotonic() if now is None else now
        self.dirty = False
        value = self.curves.html(str(self.mode.value))
        if value:
            self.charts.value = value
            self.widget.layout.display = "flex"
