import {
  appendJobMetrics,
  historyFromResponse,
  mergeHistory,
  presentValues,
  sparklinePoints
} from '../model/metrics';
import { makeJob } from './helpers';

describe('metrics history', () => {
  it('reads the server history (epoch seconds or RFC 3339)', () => {
    const history = historyFromResponse({
      ranks: {
        '0': [
          {
            ts: 100,
            cpu_percent: 10,
            memory_bytes: 5,
            gpu_util: null,
            gpu_memory_bytes: null
          },
          { ts: '1970-01-01T00:01:41Z', cpu_percent: 20, memory_bytes: 6 }
        ],
        '1': [{ ts: 100, cpu_percent: 30 }]
      }
    });
    expect(history[0].ts).toEqual([100000, 101000]);
    expect(history[0].values.cpu_percent).toEqual([10, 20]);
    expect(history[0].values.gpu_util).toEqual([null, null]);
    expect(presentValues(history[1], 'cpu_percent')).toEqual([30]);
    // the bare rank map is accepted too; junk is skipped
    expect(
      historyFromResponse({ '2': [{ ts: 1, cpu_percent: 1 }], x: 3 })[2].ts
    ).toEqual([1000]);
    expect(historyFromResponse(null)).toEqual({});
  });

  it('live job messages add a point per running rank, bounded', () => {
    const job = makeJob({ workers: 2 });
    job.ranks[1].state = 'succeeded';
    let history = {};
    for (let t = 1; t <= 5; t++) {
      job.ranks[0].metrics = { ...job.ranks[0].metrics, cpu_percent: t };
      history = appendJobMetrics(history, job, t * 1000, 3);
    }
    const h = history as any;
    expect(h[0].values.cpu_percent).toEqual([3, 4, 5]);
    expect(h[0].ts).toEqual([3000, 4000, 5000]);
    expect(h[1]).toBeUndefined();
    // the same instant twice is one point, and an unchanged history is the same object
    expect(appendJobMetrics(history, job, 5000, 3)).toBe(history);
  });

  it('merging keeps loaded history and then the newer live points', () => {
    const loaded = historyFromResponse({
      '0': [
        { ts: 1, cpu_percent: 1 },
        { ts: 2, cpu_percent: 2 }
      ]
    });
    const job = makeJob({ workers: 1 });
    let live = appendJobMetrics({}, job, 1500); // older than the history's end: dropped
    live = appendJobMetrics(live, job, 3000);
    const merged = mergeHistory(loaded, live);
    expect(merged[0].ts).toEqual([1000, 2000, 3000]);
    expect(merged[0].values.cpu_percent).toEqual([1, 2, 50]);
  });

  it('sparkline points span the width, scaled to max', () => {
    expect(sparklinePoints([], 60, 10)).toBe('');
    expect(sparklinePoints([0, 50, 100], 60, 10, 100)).toBe(
      '0.0,10.0 30.0,5.0 60.0,0.0'
    );
    expect(sparklinePoints([150], 60, 10, 100)).toBe('60.0,0.0'); // clamped to the scale
  });
});
