import * as React from 'react';

import { sparklinePoints } from '../model/metrics';

export interface SparklineProps {
  values: number[];
  /** Top of the scale (100 for percentages); the largest value otherwise. */
  max?: number;
  label: string;
  height?: number;
}

/** Drawing units across; the drawing is stretched to the width it is given. */
const WIDTH = 100;

/**
 * A tiny area chart as wide as its container; the label is read out instead of the
 * drawing. Fewer than two values draw an empty baseline, so rows keep their height.
 */
export function Sparkline({ values, max, label, height = 18 }: SparklineProps) {
  const points =
    values.length > 1 ? sparklinePoints(values, WIDTH, height, max) : '';
  return (
    <svg
      className="jp-mlc-sparkline"
      width="100%"
      height={height}
      viewBox={`0 0 ${WIDTH} ${height}`}
      preserveAspectRatio="none"
      role="img"
      aria-label={label}
    >
      <title>{label}</title>
      <line
        className="jp-mlc-sparkline-base"
        x1={0}
        y1={height - 0.5}
        x2={WIDTH}
        y2={height - 0.5}
        vectorEffect="non-scaling-stroke"
      />
      {points && (
        <>
          <polygon
            className="jp-mlc-sparkline-area"
            points={`0,${height} ${points} ${WIDTH},${height}`}
          />
          <polyline
            points={points}
            fill="none"
            strokeWidth="1.5"
            vectorEffect="non-scaling-stroke"
          />
        </>
      )}
    </svg>
  );
}
