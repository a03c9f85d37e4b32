import * as React from 'react';

import {
  Curves,
  EMPTY_CURVES,
  MAX_REQUESTED,
  Track,
  columnBand,
  columnMinMax,
  drawsMean,
  extent,
  followLogged,
  niceTicks,
  rankColor,
  tickText,
  valueText
} from '../model/curves';
import { isFinal } from '../model/reducer';
import { Job } from '../model/types';
import { usePanel } from './context';

/** How often a running job's new points are asked for. */
export const POLL_MS = 2000;

/** Drawing width until the panel's is known; at most MAX_WIDTH. */
const DEFAULT_WIDTH = 300;
const MAX_WIDTH = 420;
const HEIGHT = 150;
const LEFT = 44;
const RIGHT = 8;
const TOP = 22;
const BOTTOM = 20;
const PLOT_H = HEIGHT - TOP - BOTTOM;
const MEAN_COLOR = '#1e88e5';

/**
 * The job's logged series, whole: asked for once, then (while the job runs) what is new
 * since the cursor every POLL_MS; the last ask after the job ended gets its last points.
 */
export function useCurves(job: Job): Curves {
  const { api } = usePanel();
  const [curves, setCurves] = React.useState<Curves>(EMPTY_CURVES);
  const state = React.useRef<Curves>(EMPTY_CURVES);
  const final = isFinal(job);
  React.useEffect(() => {
    state.current = EMPTY_CURVES;
    setCurves(EMPTY_CURVES);
  }, [job.id]);
  React.useEffect(() => {
    let stopped = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const poll = async () => {
      try {
        let current = state.current;
        if (!current.names.length) {
          const first = await api.getLogged(job.id);
          current = { ...current, names: first.names };
        }
        const wanted = current.names.slice(0, MAX_REQUESTED);
        if (wanted.length) {
          current = await followLogged(
            current,
            after => api.getLogged(job.id, wanted, after),
            () => stopped
          );
        }
        if (!stopped) {
          state.current = current;
          setCurves(current);
        }
      } catch {
        // the next poll tries again (the job may be deleted: the detail closes)
      }
      if (!stopped && !final) {
        timer = setTimeout(() => void poll(), POLL_MS);
      }
    };
    void poll();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }, [api, job.id, final]);
  return curves;
}

function points(
  pts: Array<[number, number]>,
  px: (x: number) => number,
  py: (y: number) => number
): string {
  return pts
    .map(([x, y]) => `${px(x).toFixed(1)},${py(y).toFixed(1)}`)
    .join(' ');
}

export interface CurveChartProps {
  name: string;
  tracks: Record<number, Track>;
  mean: boolean;
  /** CSS pixels across: one drawing unit a pixel, so text keeps its size. */
  width?: number;
}

/**
 * One series: one line per rank, or the ranks' mean with a min–max band. Memoised: a job
 * event redraws the detail, but a chart only when its points, mode or width change.
 */
export const CurveChart = React.memo(function CurveChart({
  name,
  tracks,
  mean,
  width = DEFAULT_WIDTH
}: CurveChartProps) {
  const WIDTH = width;
  const PLOT_W = Math.max(40, WIDTH - LEFT - RIGHT);
  const ranks = Object.keys(tracks)
    .map(Number)
    .sort((a, b) => a - b);
  const list = ranks.map(r => tracks[r]);
  const { x0, x1, y0: lo, y1: hi } = extent(list);
  if (!isFinite(x0)) {
    return null;
  }
  const y = niceTicks(lo, hi);
  const px = (x: number) =>
    LEFT + (x1 > x0 ? (PLOT_W * (x - x0)) / (x1 - x0) : PLOT_W / 2);
  const py = (v: number) => TOP + (PLOT_H * (y.hi - v)) / (y.hi - y.lo);
  const xticks =
    x1 > x0 ? niceTicks(x0, x1, 5).ticks.filter(t => t >= x0 && t <= x1) : [x0];
  const kept = list.reduce((n, t) => n + t.steps.length, 0);
  let shapes: React.ReactNode;
  let last: string;
  let drawn = 0;
  if (mean) {
    const band = columnBand(list, x0, x1, PLOT_W);
    drawn = band.length;
    const outline = points(
      [
        ...band.map(b => [b.step, b.max] as [number, number]),
        ...[...band].reverse().map(b => [b.step, b.min] as [number, number])
      ],
      px,
      py
    );
    shapes = (
      <>
        <polygon
          className="jp-mlc-curve-band"
          points={outline}
          fill={MEAN_COLOR}
          fillOpacity={0.3}
        />
        <polyline
          className="jp-mlc-curve-mean"
          points={points(
            band.map(b => [b.step, b.mean]),
            px,
            py
          )}
          fill="none"
          stroke={MEAN_COLOR}
          strokeWidth={1.5}
        />
      </>
    );
    const lastValues = list.map(t => t.values[t.values.length - 1]);
    last = `mean ${valueText(lastValues.reduce((a, b) => a + b, 0) / lastValues.length)}`;
  } else {
    shapes = ranks.map(rank => {
      const t = tracks[rank];
      const pts = columnMinMax(t.steps, t.values, x0, x1, PLOT_W);
      drawn += pts.length;
      return (
        <polyline
          key={rank}
          className="jp-mlc-curve-line"
          data-rank={rank}
          data-points={pts.length}
          points={points(pts, px, py)}
          fill="none"
          stroke={rankColor(rank)}
          strokeWidth={1.5}
          strokeLinejoin="round"
        />
      );
    });
    const first = list[0];
    const value = valueText(first.values[first.values.length - 1]);
    last = ranks.length === 1 ? value : `rank ${ranks[0]}: ${value}`;
  }
  const label = `${name} over steps ${x0} to ${x1}, ${kept} points`;
  return (
    <svg
      className="jp-mlc-curve"
      data-series={name}
      data-kept={kept}
      data-drawn={drawn}
      viewBox={`0 0 ${WIDTH} ${HEIGHT}`}
      width={WIDTH}
      height={HEIGHT}
      role="img"
      aria-label={label}
    >
      <title>{label}</title>
      {y.ticks.map(t => (
        <g key={t}>
          <line
            className="jp-mlc-curve-grid"
            x1={LEFT}
            x2={WIDTH - RIGHT}
            y1={py(t)}
            y2={py(t)}
          />
          <text
            className="jp-mlc-curve-tick"
            x={LEFT - 4}
            y={py(t) + 3}
            textAnchor="end"
          >
            {tickText(t)}
          </text>
        </g>
      ))}
      <text
        className="jp-mlc-curve-tick"
        x={LEFT - 12}
        y={HEIGHT - 6}
        textAnchor="end"
      >
        step
      </text>
      {xticks.map(t => (
        <g key={t}>
          <line
            className="jp-mlc-curve-grid"
            x1={px(t)}
            x2={px(t)}
            y1={TOP + PLOT_H}
            y2={TOP + PLOT_H + 3}
          />
          <text
            className="jp-mlc-curve-tick"
            x={px(t)}
            y={HEIGHT - 6}
            textAnchor="middle"
          >
            {tickText(t)}
          </text>
        </g>
      ))}
      <text className="jp-mlc-curve-title" x={LEFT} y={14}>
        {name}
        <tspan className="jp-mlc-curve-tick" dx={8}>
          {last}
        </tspan>
      </text>
      {shapes}
    </svg>
  );
});

const MODES: Array<{ mode: string; label: string; title: string }> = [
  {
    mode: 'auto',
    label: 'auto',
    title: 'One line per rank up to 8 ranks, then their mean and range'
  },
  { mode: 'ranks', label: 'per rank', title: 'One line per rank' },
  {
    mode: 'mean',
    label: 'mean ± range',
    title: "The ranks' mean, with a band from their min to their max"
  }
];

/** Every series the job logged (mlc.log), live while it runs. */
export function CurveCharts({ job }: { job: Job }) {
  const curves = useCurves(job);
  const [mode, setMode] = React.useState('auto');
  const [width, setWidth] = React.useState(DEFAULT_WIDTH);
  const observer = React.useRef<ResizeObserver | null>(null);
  const measure = React.useCallback((node: HTMLElement | null) => {
    observer.current?.disconnect();
    if (node && typeof ResizeObserver !== 'undefined') {
      observer.current = new ResizeObserver(([entry]) => {
        const w = Math.floor(entry.contentRect.width);
        setWidth(w > 0 ? Math.min(w, MAX_WIDTH) : DEFAULT_WIDTH);
      });
      observer.current.observe(node);
    }
  }, []);
  React.useEffect(() => () => observer.current?.disconnect(), []);
  const names = Object.keys(curves.tracks).sort();
  if (!names.length) {
    return null;
  }
  const ranks = new Set<number>();
  for (const n of names) {
    Object.keys(curves.tracks[n]).forEach(r => ranks.add(Number(r)));
  }
  const mean = drawsMean(mode, ranks.size);
  const sorted = [...ranks].sort((a, b) => a - b);
  return (
    <section
      className="jp-mlc-curves"
      ref={measure}
      aria-labelledby={`jp-mlc-curves-${job.id}`}
      data-mode={mean ? 'mean' : 'ranks'}
    >
      <div className="jp-mlc-curves-head">
        <h4 className="jp-mlc-subtitle" id={`jp-mlc-curves-${job.id}`}>
          Curves
        </h4>
        <div className="jp-mlc-curves-mode" role="radiogroup" aria-label="Draw">
          {MODES.map(m => (
            <button
              key={m.mode}
              className="jp-mlc-button jp-mlc-button-small"
              role="radio"
              aria-checked={mode === m.mode}
              title={m.title}
              onClick={() => setMode(m.mode)}
            >
              {m.label}
            </button>
          ))}
        </div>
      </div>
      <div className="jp-mlc-curves-legend">
        {mean ? (
          <span>
            <span className="jp-mlc-curve-key" style={{ color: MEAN_COLOR }}>
              ━
            </span>{' '}
            mean of {ranks.size} ranks, band: min–max
          </span>
        ) : (
          sorted.map(r => (
            <span key={r} className="jp-mlc-curves-legend-item">
              <span
                className="jp-mlc-curve-key"
                style={{ color: rankColor(r) }}
              >
                ━
              </span>{' '}
              rank {r}
            </span>
          ))
        )}
      </div>
      {names.map(n => (
        <CurveChart
          key={n}
          name={n}
          tracks={curves.tracks[n]}
          mean={mean}
          width={width}
        />
      ))}
      {curves.names.length > MAX_REQUESTED && (
        <div className="jp-mlc-hint">
          {curves.names.length - MAX_REQUESTED} more series: mlcluster metrics{' '}
          {job.id}
        </div>
      )}
    </section>
  );
}
