import * as React from 'react';

import { sparklinePoints } from '../model/metrics';

export interface SparklineProps {
  values: number[];
  /** Top of the scale (100 for percentages); the largest value otherwise. */
  max?: number;
  label: string;
  width?: number;
  height?: number;
}

/** A tiny line chart; the label is read out instead of the drawing. */
export function Sparkline({
  values,
  max,
  label,
  width = 64,
  height = 16
}: SparklineProps) {
  const points = sparklinePoints(values, width, height, max);
  return (
    <svg
      className="jp-mlc-sparkline"
      width={width}
      height={height}
      viewBox={`0 0 ${width} ${height}`}
      role="img"
      aria-label={label}
    >
      <title>{label}</title>
      {points && <polyline points={points} fill="none" strokeWidth="1.5" />}
    </svg>
  );
}
