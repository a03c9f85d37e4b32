import {
  TailBuffer,
  bottomScrollTop,
  isAtBottom,
  visibleWindow
} from '../model/virtual';

describe('virtual list window', () => {
  const base = { rowHeight: 18, viewportHeight: 180, overscan: 5 };

  it('renders only the rows in view plus overscan', () => {
    const win = visibleWindow({ ...base, count: 100000, scrollTop: 18 * 1000 });
    expect(win).toEqual({
      start: 995,
      end: 1016,
      offset: 995 * 18,
      totalHeight: 1800000
    });
    expect(win.end - win.start).toBeLessThan(30);
  });

  it('clamps at the top and at the end', () => {
    expect(visibleWindow({ ...base, count: 100, scrollTop: -50 })).toEqual({
      start: 0,
      end: 16,
      offset: 0,
      totalHeight: 1800
    });
    // A scrollTop past the end (the list just shrank) still shows the last rows.
    const end = visibleWindow({ ...base, count: 100, scrollTop: 99999 });
    expect(end.end).toBe(100);
    expect(end.start).toBe(90 - 5);
  });

  it('handles lists shorter than the viewport, and empty ones', () => {
    expect(visibleWindow({ ...base, count: 3, scrollTop: 0 })).toEqual({
      start: 0,
      end: 3,
      offset: 0,
      totalHeight: 54
    });
    expect(visibleWindow({ ...base, count: 0, scrollTop: 0 })).toEqual({
      start: 0,
      end: 0,
      offset: 0,
      totalHeight: 0
    });
  });

  it('a partly visible row at either edge is rendered', () => {
    const win = visibleWindow({
      ...base,
      overscan: 0,
      count: 1000,
      scrollTop: 9
    });
    // rows 0 (half hidden) .. 10 (half shown)
    expect(win.start).toBe(0);
    expect(win.end).toBe(11);
  });

  it('knows when the view is at the bottom (follow mode)', () => {
    expect(isAtBottom(1800 - 180, 180, 1800)).toBe(true);
    expect(isAtBottom(1800 - 183, 180, 1800)).toBe(true); // within slack
    expect(isAtBottom(1000, 180, 1800)).toBe(false);
    expect(bottomScrollTop(100, 18, 180)).toBe(1620);
    expect(bottomScrollTop(3, 18, 180)).toBe(0);
  });

  it('renders the same few rows whether the log has 1k or 1M lines', () => {
    const rows = (count: number) => {
      const win = visibleWindow({ ...base, count, scrollTop: 18 * 500 });
      return win.end - win.start;
    };
    expect(rows(1000)).toBe(21);
    expect(rows(100000)).toBe(21);
    expect(rows(1000000)).toBe(21);
  });
});

describe('tail buffer', () => {
  type Line = { rank: number; n: number };
  const lines = (from: number, to: number, ranks = 2): Line[] =>
    Array.from({ length: to - from }, (_, i) => ({
      rank: (from + i) % ranks,
      n: from + i
    }));

  it('keeps per-rank views in step with the whole', () => {
    const buf = new TailBuffer<Line>(l => l.rank, 1000);
    buf.append(lines(0, 10, 3));
    expect(buf.length).toBe(10);
    expect(buf.lines(1).map(l => l.n)).toEqual([1, 4, 7]);
    expect(buf.keys()).toEqual([0, 1, 2]);
    expect(buf.lines(7)).toEqual([]);
  });

  it('drops the oldest lines beyond the limit (in batches of 10%)', () => {
    const buf = new TailBuffer<Line>(l => l.rank, 100);
    buf.append(lines(0, 110));
    expect(buf.length).toBe(110); // within the slack
    buf.append(lines(110, 111));
    expect(buf.length).toBe(100);
    expect(buf.dropped).toBe(11);
    expect(buf.lines()[0].n).toBe(11);
    // the per-rank views dropped exactly the same lines
    expect(buf.lines(0)[0].n).toBe(12);
    expect(buf.lines(1)[0].n).toBe(11);
    expect(buf.lines(0).length + buf.lines(1).length).toBe(100);
  });

  it('appends 100k lines one batch at a time quickly, holding only the tail', () => {
    const buf = new TailBuffer<Line>(l => l.rank, 50000);
    const t0 = performance.now();
    for (let i = 0; i < 200000; i += 100) {
      buf.append(lines(i, i + 100, 4));
    }
    const ms = performance.now() - t0;
    expect(buf.length).toBeLessThanOrEqual(55000);
    expect(buf.lines()[buf.length - 1].n).toBe(199999);
    expect(buf.lines(3).every(l => l.rank === 3)).toBe(true);
    expect(ms).toBeLessThan(1000);
  });

  it('clear forgets lines and the dropped count', () => {
    const buf = new TailBuffer<Line>(l => l.rank, 5);
    buf.append(lines(0, 20));
    buf.clear();
    expect(buf.length).toBe(0);
    expect(buf.dropped).toBe(0);
    expect(buf.lines(0)).toEqual([]);
  });
});
