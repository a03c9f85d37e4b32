/**
 * The series a job logged (`mlc.log`, GET /jobs/{id}/metrics?series=...&after=...) as the
 * sidebar draws them: every point the server sent is kept here (name -> rank -> steps and
 * values); drawing downsamples to at most two points per pixel column, the column's min and
 * max in the order they came, so a polyline through them looks like the whole series.
 * The same drawing as the cell monitor's (jupyterlab_mlcluster/kernel/curves.py).
 */
import { components } from './api-types';

export type LoggedSeries = components['schemas']['LoggedSeries'];

export interface Track {
  steps: number[];
  values: number[];
}

export interface Curves {
  /** Every name the job has logged so far (the server's `names`). */
  names: string[];
  /** name -> rank -> points, whole. */
  tracks: Record<string, Record<number, Track>>;
  /** Pass back as `after` for what is new. */
  cursor: number;
}

export const EMPTY_CURVES: Curves = { names: [], tracks: {}, cursor: 0 };

/** Above this many ranks, "auto" draws the ranks' mean with a min–max band. */
export const MAX_RANK_LINES = 8;

/** The series one request asks for (the API's cap). */
export const MAX_REQUESTED = 50;

/** Mid-tones, legible on light and dark backgrounds (the cell monitor's palette). */
export const PALETTE = [
  '#1e88e5',
  '#f4511e',
  '#43a047',
  '#8e24aa',
  '#e53935',
  '#00acc1',
  '#fb8c00',
  '#d81b60',
  '#7cb342',
  '#5c6bc0'
];

export function rankColor(rank: number): string {
  return PALETTE[rank % PALETTE.length];
}

/** The curves with an answer's points appended (an answer asked with `after: cursor`). */
export function mergeLogged(curves: Curves, answer: LoggedSeries): Curves {
  const tracks: Curves['tracks'] = { ...curves.tracks };
  for (const s of answer.series) {
    const byRank = { ...(tracks[s.name] ?? {}) };
    const old = byRank[s.rank] ?? { steps: [], values: [] };
    byRank[s.rank] = {
      steps: old.steps.concat(s.steps),
      values: old.values.concat(s.values)
    };
    tracks[s.name] = byRank;
  }
  return { names: answer.names, tracks, cursor: answer.cursor };
}

/**
 * The curves caught up: one answer is a bounded page of the store (`more` while points
 * follow its cursor), so ask from each answer's cursor until none is left, or `stopped`.
 */
export async function followLogged(
  curves: Curves,
  ask: (after: number) => Promise<LoggedSeries>,
  stopped: () => boolean = () => false
): Promise<Curves> {
  let more = true;
  while (more && !stopped()) {
    const answer = await ask(curves.cursor);
    curves = mergeLogged(curves, answer);
    more = answer.more === true && answer.cursor > 0;
  }
  return curves;
}

/**
 * Downsample for drawing: per pixel column of [x0, x1], the min and the max point in the
 * order they came; columns left to right. At most 2 * columns [step, value] points.
 */
export function columnMinMax(
  steps: ArrayLike<number>,
  values: ArrayLike<number>,
  x0: number,
  x1: number,
  columns: number
): Array<[number, number]> {
  const scale = x1 > x0 ? columns / (x1 - x0) : 0;
  const lo = new Int32Array(columns).fill(-1);
  const hi = new Int32Array(columns).fill(-1);
  for (let i = 0; i < steps.length; i++) {
    const c = Math.min(Math.floor((steps[i] - x0) * scale), columns - 1);
    if (lo[c] < 0) {
      lo[c] = hi[c] = i;
    } else if (values[i] < values[lo[c]]) {
      lo[c] = i;
    } else if (values[i] > values[hi[c]]) {
      hi[c] = i;
    }
  }
  const out: Array<[number, number]> = [];
  for (let c = 0; c < columns; c++) {
    if (lo[c] < 0) {
      continue;
    }
    const [a, b] = lo[c] <= hi[c] ? [lo[c], hi[c]] : [hi[c], lo[c]];
    out.push([steps[a], values[a]]);
    if (b !== a) {
      out.push([steps[b], values[b]]);
    }
  }
  return out;
}

export interface BandPoint {
  step: number;
  min: number;
  mean: number;
  max: number;
}

/** The ranks together, per pixel column: min, max, and the mean of the ranks' means. */
export function columnBand(
  tracks: Track[],
  x0: number,
  x1: number,
  columns: number
): BandPoint[] {
  const scale = x1 > x0 ? columns / (x1 - x0) : 0;
  const min = new Float64Array(columns).fill(Infinity);
  const max = new Float64Array(columns).fill(-Infinity);
  const meanSum = new Float64Array(columns);
  const meanCount = new Int32Array(columns);
  const sum = new Float64Array(columns);
  const count = new Int32Array(columns);
  for (const track of tracks) {
    sum.fill(0);
    count.fill(0);
    for (let i = 0; i < track.steps.length; i++) {
      const c = Math.min(
        Math.floor((track.steps[i] - x0) * scale),
        columns - 1
      );
      const v = track.values[i];
      min[c] = Math.min(min[c], v);
      max[c] = Math.max(max[c], v);
      sum[c] += v;
      count[c] += 1;
    }
    for (let c = 0; c < columns; c++) {
      if (count[c]) {
        meanSum[c] += sum[c] / count[c];
        meanCount[c] += 1;
      }
    }
  }
  const out: BandPoint[] = [];
  for (let c = 0; c < columns; c++) {
    if (meanCount[c]) {
      out.push({
        step: scale ? x0 + (c + 0.5) / scale : x0,
        min: min[c],
        mean: meanSum[c] / meanCount[c],
        max: max[c]
      });
    }
  }
  return out;
}

/** A domain covering [lo, hi] on round numbers, and the ticks on it. */
export function niceTicks(
  lo: number,
  hi: number,
  count = 4
): { lo: number; hi: number; ticks: number[] } {
  if (!(hi > lo)) {
    const half = Math.abs(lo) * 0.5 || 0.5;
    [lo, hi] = [lo - half, hi + half];
  }
  const raw = (hi - lo) / count;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step =
    [1, 2, 2.5, 5, 10].map(f => f * magnitude).find(s => s >= raw) ??
    10 * magnitude;
  const first = Math.floor(lo / step);
  const last = Math.ceil(hi / step);
  const ticks: number[] = [];
  for (let k = first; k <= last; k++) {
    ticks.push(k * step);
  }
  return { lo: ticks[0], hi: ticks[ticks.length - 1], ticks };
}

export function tickText(value: number): string {
  if (Number.isInteger(value) && Math.abs(value) >= 1000) {
    return Math.abs(value) < 1e6 ? `${value / 1000}k` : `${value / 1e6}M`;
  }
  if (value === 0 || (Math.abs(value) >= 1e-4 && Math.abs(value) < 1e5)) {
    return String(Number(value.toPrecision(3)));
  }
  return value.toExponential(0);
}

export function valueText(value: number): string {
  if (value === 0 || (Math.abs(value) >= 1e-3 && Math.abs(value) < 1e5)) {
    return String(Number(value.toPrecision(4)));
  }
  return value.toExponential(2);
}

/** Steps and values spanned by every rank's track of a series. */
export function extent(tracks: Track[]): {
  x0: number;
  x1: number;
  y0: number;
  y1: number;
} {
  let [x0, x1, y0, y1] = [Infinity, -Infinity, Infinity, -Infinity];
  for (const t of tracks) {
    for (let i = 0; i < t.steps.length; i++) {
      x0 = Math.min(x0, t.steps[i]);
      x1 = Math.max(x1, t.steps[i]);
      y0 = Math.min(y0, t.values[i]);
      y1 = Math.max(y1, t.values[i]);
    }
  }
  return { x0, x1, y0, y1 };
}

/** Draw the mean with a band: asked for, or "auto" with more ranks than lines. */
export function drawsMean(mode: string, ranks: number): boolean {
  return mode === 'mean' || (mode === 'auto' && ranks > MAX_RANK_LINES);
}
