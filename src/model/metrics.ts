/**
 * Per-rank metric series for the sparklines: loaded from `GET /jobs/{id}/metrics`, then
 * extended by the metrics each live `job` event carries. Pure functions over plain data.
 */
import { Job, RankMetrics } from './types';

export type MetricName = keyof RankMetrics;

export interface Series {
  /** Milliseconds since the epoch, ascending. */
  ts: number[];
  values: Record<MetricName, Array<number | null>>;
}

/** rank -> series */
export type MetricsHistory = Readonly<Record<number, Series>>;

export const METRIC_NAMES: MetricName[] = [
  'cpu_percent',
  'memory_bytes',
  'gpu_util',
  'gpu_memory_bytes'
];

/** How many points a series keeps (two minutes at one sample a second). */
export const DEFAULT_POINTS = 120;

function emptySeries(): Series {
  return {
    ts: [],
    values: {
      cpu_percent: [],
      memory_bytes: [],
      gpu_util: [],
      gpu_memory_bytes: []
    }
  };
}

function numberOrNull(value: unknown): number | null {
  return typeof value === 'number' && isFinite(value) ? value : null;
}

/** Epoch seconds (the store's unit) or an RFC 3339 string -> epoch milliseconds. */
function toMillis(ts: unknown): number | null {
  if (typeof ts === 'number' && isFinite(ts)) {
    return ts * 1000;
  }
  if (typeof ts === 'string') {
    const ms = Date.parse(ts);
    return isNaN(ms) ? null : ms;
  }
  return null;
}

function appendPoint(
  series: Series,
  ts: number,
  sample: Partial<Record<MetricName, unknown>>,
  maxPoints: number
): Series {
  const last = series.ts.length ? series.ts[series.ts.length - 1] : -Infinity;
  if (ts <= last) {
    return series; // already have it (history and live events overlap)
  }
  const keep = (arr: Array<number | null>, v: number | null) =>
    arr.length >= maxPoints
      ? [...arr.slice(arr.length - maxPoints + 1), v]
      : [...arr, v];
  const values = {} as Series['values'];
  for (const name of METRIC_NAMES) {
    values[name] = keep(series.values[name], numberOrNull(sample[name]));
  }
  return {
    ts: keep(series.ts, ts) as number[],
    values
  };
}

/**
 * The body of `GET /jobs/{id}/metrics` -> history. Accepted: `{"ranks": {"0": [sample...]}}`
 * or the rank map itself, each sample `{"ts": epoch-seconds | RFC 3339, "cpu_percent": ..., ...}`.
 */
export function historyFromResponse(
  body: unknown,
  maxPoints: number = DEFAULT_POINTS
): MetricsHistory {
  const root = (body ?? {}) as Record<string, unknown>;
  const ranks = (
    root.ranks && typeof root.ranks === 'object' ? root.ranks : root
  ) as Record<string, unknown>;
  const out: Record<number, Series> = {};
  for (const [key, samples] of Object.entries(ranks)) {
    const rank = Number(key);
    if (!Number.isInteger(rank) || !Array.isArray(samples)) {
      continue;
    }
    let series = emptySeries();
    for (const sample of samples) {
      const ts = toMillis((sample as Record<string, unknown>)?.ts);
      if (ts !== null) {
        series = appendPoint(series, ts, sample, maxPoints);
      }
    }
    out[rank] = series;
  }
  return out;
}

/** Add the metrics a live job message carries, stamped with the time it arrived. */
export function appendJobMetrics(
  history: MetricsHistory,
  job: Pick<Job, 'ranks'>,
  now: number = Date.now(),
  maxPoints: number = DEFAULT_POINTS
): MetricsHistory {
  let changed = false;
  const out: Record<number, Series> = { ...history };
  for (const rank of job.ranks) {
    if (rank.state !== 'running' || !rank.metrics) {
      continue;
    }
    const before = out[rank.rank] ?? emptySeries();
    const after = appendPoint(before, now, rank.metrics, maxPoints);
    if (after !== before) {
      out[rank.rank] = after;
      changed = true;
    }
  }
  return changed ? out : history;
}

/** The values of one metric with the missing points left out. */
export function presentValues(
  series: Series | undefined,
  name: MetricName
): number[] {
  return (series?.values[name] ?? []).filter((v): v is number => v !== null);
}

/**
 * Polyline points for a sparkline `width` x `height`, y growing downwards.
 * `max` fixes the top of the scale (100 for percentages); otherwise the largest value.
 */
export function sparklinePoints(
  values: number[],
  width: number,
  height: number,
  max?: number
): string {
  if (values.length === 0) {
    return '';
  }
  const top = max ?? Math.max(...values, 1e-9);
  const step = values.length > 1 ? width / (values.length - 1) : 0;
  return values
    .map((v, i) => {
      const x = values.length > 1 ? i * step : width;
      const y = height - (Math.min(Math.max(v, 0), top) / top) * height;
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    })
    .join(' ');
}

/** History loaded from the server, then the live points that are newer than it. */
export function mergeHistory(
  loaded: MetricsHistory,
  live: MetricsHistory,
  maxPoints: number = DEFAULT_POINTS
): MetricsHistory {
  const out: Record<number, Series> = { ...live, ...loaded };
  for (const [key, series] of Object.entries(live)) {
    const rank = Number(key);
    let merged = out[rank];
    series.ts.forEach((ts, i) => {
      const sample: Partial<Record<MetricName, number | null>> = {};
      for (const name of METRIC_NAMES) {
        sample[name] = series.values[name][i];
      }
      merged = appendPoint(merged, ts, sample, maxPoints);
    });
    out[rank] = merged;
  }
  return out;
}
