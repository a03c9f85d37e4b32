import {
  EMPTY_CURVES,
  columnBand,
  columnMinMax,
  drawsMean,
  extent,
  followLogged,
  LoggedSeries,
  mergeLogged,
  niceTicks,
  tickText
} from '../model/curves';

describe('logged series', () => {
  it('follows the cursor page after page until the server says there is no more', async () => {
    const asked: number[] = [];
    const pages: Record<number, LoggedSeries> = {
      0: {
        names: ['loss'],
        series: [
          { name: 'loss', rank: 0, steps: [0], values: [3], times: [1] }
        ],
        cursor: 50,
        more: true
      },
      50: {
        names: ['loss'],
        series: [
          { name: 'loss', rank: 0, steps: [1], values: [2], times: [2] }
        ],
        cursor: 90,
        more: true
      },
      90: { names: ['loss'], series: [], cursor: 90, more: false }
    };
    const curves = await followLogged(EMPTY_CURVES, async after => {
      asked.push(after);
      return pages[after];
    });
    expect(asked).toEqual([0, 50, 90]);
    expect(curves.cursor).toBe(90);
    expect(curves.tracks.loss[0].steps).toEqual([0, 1]);
  });

  it('appends what each answer brings, per name and rank, and keeps the cursor', () => {
    let curves = mergeLogged(EMPTY_CURVES, {
      names: ['loss'],
      series: [
        { name: 'loss', rank: 0, steps: [0, 1], values: [3, 2], times: [1, 2] },
        { name: 'loss', rank: 1, steps: [0], values: [4], times: [1] }
      ],
      cursor: 120,
      more: false
    });
    curves = mergeLogged(curves, {
      names: ['loss', 'lr'],
      series: [
        { name: 'loss', rank: 0, steps: [2], values: [1], times: [3] },
        { name: 'lr', rank: 0, steps: [2], values: [0.1], times: [3] }
      ],
      cursor: 200,
      more: false
    });
    expect(curves.cursor).toBe(200);
    expect(curves.names).toEqual(['loss', 'lr']);
    expect(curves.tracks.loss[0]).toEqual({
      steps: [0, 1, 2],
      values: [3, 2, 1]
    });
    expect(curves.tracks.loss[1].values).toEqual([4]);
    expect(curves.tracks.lr[0].steps).toEqual([2]);
  });
});

describe('downsampling for drawing', () => {
  const n = 10_000;
  const steps = Array.from({ length: n }, (_, i) => i);
  const values = steps.map(i => Math.sin(i / 300) + (i % 7) * 0.01);
  values[7777] = 50; // one spike among 10,000 points

  it('draws 10,000 points with at most two per pixel column, extremes kept', () => {
    const drawn = columnMinMax(steps, values, 0, n - 1, 280);
    expect(drawn.length).toBeLessThanOrEqual(560);
    expect(drawn.length).toBeGreaterThan(280);
    expect(drawn).toContainEqual([7777, 50]);
    expect(Math.min(...drawn.map(p => p[1]))).toBe(Math.min(...values));
    const xs = drawn.map(p => p[0]);
    expect(xs).toEqual([...xs].sort((a, b) => a - b));
  });

  it('keeps a few points as they are, and a single step in one column', () => {
    expect(columnMinMax([0, 1, 2], [1, 3, 2], 0, 2, 280)).toEqual([
      [0, 1],
      [1, 3],
      [2, 2]
    ]);
    expect(columnMinMax([5, 5], [1, 2], 5, 5, 280)).toEqual([
      [5, 1],
      [5, 2]
    ]);
  });

  it("bands the ranks: min, max, and the mean of the ranks' means per column", () => {
    const tracks = [
      { steps: [0, 1, 2, 3], values: [1, 1, 1, 1] },
      { steps: [0, 1, 2, 3], values: [3, 3, 3, 5] }
    ];
    const band = columnBand(tracks, 0, 3, 4);
    expect(band.map(b => [b.min, b.mean, b.max])).toEqual([
      [1, 2, 3],
      [1, 2, 3],
      [1, 2, 3],
      [1, 3, 5]
    ]);
    expect(columnBand(tracks, 0, 3, 2)).toHaveLength(2);
  });

  it('chooses mean and band above 8 ranks in auto', () => {
    expect(drawsMean('auto', 8)).toBe(false);
    expect(drawsMean('auto', 9)).toBe(true);
    expect(drawsMean('ranks', 64)).toBe(false);
    expect(drawsMean('mean', 2)).toBe(true);
  });
});

describe('axes', () => {
  it('covers the values on round ticks', () => {
    const { lo, hi, ticks } = niceTicks(-0.01, 1.16);
    expect(lo).toBeLessThanOrEqual(-0.01);
    expect(hi).toBeGreaterThanOrEqual(1.16);
    expect(ticks.length).toBeLessThanOrEqual(8);
    expect(niceTicks(3, 3).ticks.length).toBeGreaterThan(1);
    expect(tickText(2000)).toBe('2k');
    expect(tickText(0.5)).toBe('0.5');
    expect(extent([{ steps: [3, 1], values: [2, -1] }])).toEqual({
      x0: 1,
      x1: 3,
      y0: -1,
      y1: 2
    });
  });
});
