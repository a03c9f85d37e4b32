import {
  asSentence,
  elapsedLabel,
  exitText,
  failedRankPrefix,
  formatAge,
  formatBytes,
  formatDuration,
  formatPercent,
  idleGpuSeconds,
  jobElapsed,
  jobProgress,
  parseTime,
  rankSummary
} from '../model/format';
import { makeJob } from './helpers';

const NOW = Date.parse('2026-11-22T12:00:00.000Z');
const ago = (seconds: number) => new Date(NOW - seconds * 1000).toISOString();

describe('formatting', () => {
  it('ages', () => {
    expect(formatAge(ago(2), NOW)).toBe('just now');
    expect(formatAge(ago(42), NOW)).toBe('42s');
    expect(formatAge(ago(5 * 60 + 59), NOW)).toBe('5m');
    expect(formatAge(ago(3 * 3600), NOW)).toBe('3h');
    expect(formatAge(ago(2 * 86400 + 5), NOW)).toBe('2d');
    expect(formatAge(ago(15 * 86400), NOW)).toBe('2w');
    expect(formatAge(ago(-30), NOW)).toBe('just now'); // clock skew: never negative
    expect(formatAge(null, NOW)).toBe('');
    expect(formatAge('not a time', NOW)).toBe('');
  });

  it('durations', () => {
    expect(formatDuration(0)).toBe('0s');
    expect(formatDuration(59.9)).toBe('59s');
    expect(formatDuration(65)).toBe('1m 05s');
    expect(formatDuration(3600 + 4 * 60 + 7)).toBe('1h 04m');
    expect(formatDuration(3 * 86400 + 4 * 3600)).toBe('3d 4h');
    expect(formatDuration(-1)).toBe('');
    expect(formatDuration(null)).toBe('');
    expect(formatDuration(Infinity)).toBe('');
  });

  it('bytes', () => {
    expect(formatBytes(0)).toBe('0 B');
    expect(formatBytes(512)).toBe('512 B');
    expect(formatBytes(1536)).toBe('1.50 KiB');
    expect(formatBytes(312000000)).toBe('298 MiB');
    expect(formatBytes(12 * 1024 ** 3)).toBe('12.0 GiB');
    expect(formatBytes(5 * 1024 ** 6)).toBe('5120 PiB');
    expect(formatBytes(null)).toBe('');
    expect(formatBytes(-3)).toBe('');
  });

  it('percent', () => {
    expect(formatPercent(97.4)).toBe('97%');
    expect(formatPercent(null)).toBe('');
  });

  it('parses RFC 3339 times with milliseconds or microseconds', () => {
    expect(parseTime('2026-11-22T01:02:03.123Z')).toBe(
      Date.UTC(2026, 10, 22, 1, 2, 3, 123)
    );
    expect(parseTime('2026-11-22T01:02:03.123456Z')).toBe(
      Date.UTC(2026, 10, 22, 1, 2, 3, 123)
    );
    expect(parseTime(undefined)).toBeNull();
  });

  it('elapsed runs until now, and stops at finished', () => {
    expect(
      jobElapsed({ created: ago(100), started: ago(90), finished: null }, NOW)
    ).toBe(90);
    expect(
      jobElapsed(
        { created: ago(100), started: ago(90), finished: ago(30) },
        NOW
      )
    ).toBe(60);
    expect(
      jobElapsed({ created: ago(100), started: null, finished: null }, NOW)
    ).toBe(100);
  });
});

describe('rank summary', () => {
  const withRanks = (state: string, rankStates: string[], extra = {}) =>
    makeJob({
      state,
      workers: rankStates.length,
      ranks: rankStates.map((s, rank) => ({ rank, state: s, exit_code: null })),
      ...extra
    });

  it('says how many ranks run', () => {
    expect(
      rankSummary(
        withRanks('running', ['running', 'running', 'running', 'succeeded'])
      )
    ).toBe('3/4 running');
    expect(
      rankSummary(
        withRanks('starting', ['running', 'starting', 'pending', 'pending'])
      )
    ).toBe('2/4 starting');
  });

  it('says where a queued job stands (queue_position is 0-based)', () => {
    expect(
      rankSummary(
        withRanks('queued', ['pending', 'pending'], { queue_position: 1 })
      )
    ).toBe('queued (#2)');
    expect(rankSummary(withRanks('queued', ['pending']))).toBe('queued');
  });

  it('names the failing rank', () => {
    expect(
      rankSummary(
        withRanks('failed', ['cancelled', 'failed'], { failed_rank: 1 })
      )
    ).toBe('rank 1 failed');
    expect(
      rankSummary(withRanks('failed', ['failed', 'failed', 'cancelled']))
    ).toBe('2/3 failed');
    expect(rankSummary(withRanks('failed', []))).toBe('failed');
  });

  it('final states', () => {
    expect(
      rankSummary(withRanks('succeeded', ['succeeded', 'succeeded']))
    ).toBe('2/2 succeeded');
    expect(
      rankSummary(withRanks('cancelled', ['cancelled', 'cancelled']))
    ).toBe('cancelled');
  });

  it('progress comes from the first rank that reports a total', () => {
    const job = withRanks('running', ['running', 'running']);
    expect(jobProgress(job)).toBeNull();
    job.ranks[1].progress = { step: 30, total: 120 };
    expect(jobProgress(job)).toBe(0.25);
    job.ranks[0].progress = { step: 500, total: 100 };
    expect(jobProgress(job)).toBe(1);
  });
});

describe('messages', () => {
  it('read as sentences', () => {
    expect(asSentence('no Kubernetes cluster is configured')).toBe(
      'No Kubernetes cluster is configured'
    );
    expect(asSentence('Already one.')).toBe('Already one.');
    expect(asSentence('')).toBe('');
  });
});

describe('rank exits and job times', () => {
  it('say how a rank ended only when it matters', () => {
    expect(exitText(null)).toBe('');
    expect(exitText(undefined)).toBe('');
    expect(exitText(0)).toBe('');
    expect(exitText(1)).toBe('exit 1');
    expect(exitText(-15)).toBe('signal 15');
  });

  it('name the time a job waited or ran', () => {
    const at = '2026-11-22T12:00:00.000Z';
    expect(
      elapsedLabel({ state: 'queued', started: null, finished: null })
    ).toBe('Waiting');
    expect(
      elapsedLabel({ state: 'cancelled', started: null, finished: at })
    ).toBe('Waited');
    expect(
      elapsedLabel({ state: 'running', started: at, finished: null })
    ).toBe('Elapsed');
    expect(elapsedLabel({ state: 'failed', started: at, finished: at })).toBe(
      'Duration'
    );
  });
});

describe('failure banner', () => {
  it('names the failed rank unless the error already does', () => {
    expect(failedRankPrefix({ failed_rank: 2, error: 'OOMKilled' })).toBe(
      'Rank 2: '
    );
    expect(
      failedRankPrefix({
        failed_rank: 1,
        error: 'rank 1 failed: ZeroDivisionError'
      })
    ).toBe('');
    // "rank 12" is not rank 1
    expect(failedRankPrefix({ failed_rank: 1, error: 'rank 12 failed' })).toBe(
      'Rank 1: '
    );
    expect(failedRankPrefix({ failed_rank: null, error: 'timed out' })).toBe(
      ''
    );
  });
});

describe('idle GPUs', () => {
  it('counts from the flag while the job runs, and not at all otherwise', () => {
    const since = ago(125);
    expect(
      idleGpuSeconds({ state: 'running', gpu_idle_since: since }, NOW)
    ).toBe(125);
    expect(
      idleGpuSeconds({ state: 'running', gpu_idle_since: null }, NOW)
    ).toBe(null);
    expect(
      idleGpuSeconds({ state: 'succeeded', gpu_idle_since: since }, NOW)
    ).toBe(null);
    // a server without the field (older) reads as not flagged
    const older = { state: 'running' } as Parameters<typeof idleGpuSeconds>[0];
    expect(idleGpuSeconds(older, NOW)).toBe(null);
  });
});
