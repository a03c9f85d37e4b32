"""How long a 10,000-point series takes to draw (issue 35: at most 100 ms, browser timing).

The cell: the kernel reads the points (jobs/storage/series.py) and folds them into its
buckets, once a point as batches arrive; a redraw writes the SVG from the buckets
(kernel/curves.py; both timed in Python), then chromium puts that HTML into the page and lays
it out and paints it (timed in the page, from setting innerHTML to the second animation
frame). The sidebar: its downsampling and polyline (lib/model/curves.js, built by
`jlpm build`) over the same points, timed in the page the same way.

    python bench/bench_curves.py [--points 10000] [--ranks 1] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from jupyterlab_mlcluster.kernel.curves import Curves

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("MLCLUSTER_CHROMIUM", "/usr/bin/chromium")

PAGE = """<!doctype html><html><body style='--jp-ui-font-color1:#212121;
--jp-ui-font-color2:#616161;--jp-border-color2:#e0e0e0'><div id='cell'></div>
<svg id='side' viewBox='0 0 300 150' width='300' height='150'></svg></body></html>"""

# innerHTML, then two animation frames: the first runs before the paint, the second after it.
DRAW_CELL = """html => new Promise(done => {
  const t0 = performance.now();
  document.getElementById('cell').innerHTML = html;
  document.body.getBoundingClientRect();
  requestAnimationFrame(() => requestAnimationFrame(() => done(performance.now() - t0)));
})"""

DRAW_SIDEBAR = """([steps, values]) => new Promise(done => {
  const t0 = performance.now();
  const x0 = steps[0], x1 = steps[steps.length - 1];
  let y0 = Infinity, y1 = -Infinity;
  for (const v of values) { y0 = Math.min(y0, v); y1 = Math.max(y1, v); }
  const pts = window.curves.columnMinMax(steps, values, x0, x1, 252);
  const line = document.createElementNS('http://www.w3.org/2000/svg', 'polyline');
  line.setAttribute('points', pts.map(([x, y]) =>
    `${(44 + 252 * (x - x0) / (x1 - x0)).toFixed(1)},${(22 + 108 * (y1 - y) / (y1 - y0)).toFixed(1)}`).join(' '));
  line.setAttribute('fill', 'none'); line.setAttribute('stroke', '#1e88e5');
  const svg = document.getElementById('side'); svg.replaceChildren(line);
  document.body.getBoundingClientRect();
  requestAnimationFrame(() => requestAnimationFrame(() => done([performance.now() - t0, pts.length])));
})"""


def series_dir(points: int, ranks: int) -> Path:
    rng = random.Random(1)
    path = Path(tempfile.mkdtemp(prefix="bench-curves-"))
    with open(path / "series.jsonl", "w") as f:
        for rank in range(ranks):
            batch = [
                [s, 0, {"loss": math.exp(-s / 3000) + 0.1 * rng.random() + 0.02 * rank}]
                for s in range(points)
            ]
            f.write(json.dumps({"r": rank, "p": batch}) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=10_000)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    read_ms, kernel_ms, cell_ms, side_ms, cpu_ms = [], [], [], [], []
    drawn = side_points = 0
    path = series_dir(args.points, args.ranks)
    for _ in range(args.repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        view = Curves(path)
        view.poll()
        t1 = time.perf_counter()
        html = view.html()
        read_ms.append((t1 - t0) * 1000)
        kernel_ms.append((time.perf_counter() - t1) * 1000)
        cpu_ms.append((time.process_time() - c0) * 1000)
    drawn = sum(int(n) for n in __import__("re").findall(r"data-points='(\d+)'", html))
    module = (REPO / "lib" / "model" / "curves.js").read_text()
    module = module.replace("export ", "") + ("\nwindow.curves = { columnMinMax, columnBand };")
    steps = list(range(args.points))
    values = [math.exp(-s / 3000) + 0.1 * random.random() for s in steps]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1000, "height": 600})
        page.set_content(PAGE)
        page.add_script_tag(content=module)
        for _ in range(args.repeat):
            cell_ms.append(page.evaluate(DRAW_CELL, html))
            page.evaluate("() => { document.getElementById('cell').innerHTML = ''; }")
            ms, side_points = page.evaluate(DRAW_SIDEBAR, [steps, values])
            side_ms.append(ms)
        browser.close()

    def med(xs: list[float]) -> str:
        return f"{statistics.median(xs):.1f} ms (min {min(xs):.1f}, max {max(xs):.1f})"

    kept = args.points * args.ranks
    print(f"{args.points} points x {args.ranks} rank(s), {args.repeat} runs, medians:")
    print(f"  cell, kernel read + fold (once a point): {med(read_ms)}")
    print(f"  cell, kernel redraw (SVG):         {med(kernel_ms)}")
    print(f"  cell, kernel read + fold + SVG, CPU time (less the machine's load): {med(cpu_ms)}")
    print(f"  cell, browser (insert + paint):    {med(cell_ms)}  [{drawn} of {kept} points drawn]")
    redraw = statistics.median(kernel_ms) + statistics.median(cell_ms)
    print(f"  cell, a redraw (SVG + paint):      {redraw:.1f} ms")
    first = redraw + statistics.median(read_ms)
    print(f"  cell, a first draw of all of it (read + fold + SVG + paint): {first:.1f} ms")
    print(f"  sidebar, browser (downsample + paint): {med(side_ms)}  [{side_points} drawn]")


if __name__ == "__main__":
    main()
