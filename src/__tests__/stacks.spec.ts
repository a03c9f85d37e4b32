import { formatDuration } from '../model/format';
import { stacksText, stallText } from '../model/stacks';
import type { StackReport } from '../model/types';
import { makeJob, serverForTests } from './helpers';

const report: StackReport = {
  job: 'j1',
  taken: '2026-11-29T01:58:02.114Z',
  taken_epoch: 1795917482.114,
  why: 'asked',
  live: true,
  native: false,
  seconds: 0.38,
  readers: ['py-spy'],
  complete: false,
  missing: [{ rank: 3, why: 'its process (pid 9) has exited' }],
  folds: [
    {
      ranks: [0, 2],
      thread: 'MainThread',
      main: true,
      summary: 'all_reduce ← train_step (cell.py:8): dist.all_reduce(t)',
      text: 'ranks 0, 2: all_reduce ← train_step (cell.py:8): dist.all_reduce(t)',
      frames: []
    }
  ],
  ranks: []
};

describe('stacks', () => {
  const { server, api } = serverForTests();

  it('reads GET /jobs/{id}/stacks, and its 409 as an error with the message', async () => {
    server.json('GET', 'jobs/j1/stacks', 200, report);
    expect(await api.getStacks('j1')).toEqual(report);
    server.json('GET', 'jobs/j2/stacks', 409, {
      message: 'job j2 is succeeded: it kept no stacks'
    });
    const error = await api.getStacks('j2').catch(e => e);
    expect(error.status).toBe(409);
    expect(error.message).toBe('job j2 is succeeded: it kept no stacks');
  });

  it('shows each fold and says which ranks it lacks', () => {
    expect(stacksText(report).split('\n')).toEqual([
      'live, 2026-11-29T01:58:02.114Z, read by py-spy',
      'INCOMPLETE: rank 3: its process (pid 9) has exited',
      'ranks 0, 2: all_reduce ← train_step (cell.py:8): dist.all_reduce(t)'
    ]);
    const kept = { ...report, live: false, why: 'cancelled', complete: true };
    expect(stacksText(kept).split('\n')[0]).toMatch(/^kept \(cancelled\)/);
    expect(stacksText(kept)).not.toMatch(/INCOMPLETE/);
  });

  it('a running job with stalled ranks says so; otherwise nothing', () => {
    const stall = {
      ranks: [1, 3],
      since: '2026-11-29T01:00:00.000Z',
      where: ['rank 1: <module> (cell.py:9): time.sleep(600)']
    };
    const now = Date.parse('2026-11-29T01:05:02.000Z');
    const job = { ...makeJob(), state: 'running' as const, stall };
    expect(stallText(job, now)).toBe(
      `Ranks 1, 3 stalled (no output, progress or CPU) for ${formatDuration(302)}` +
        ': rank 1: <module> (cell.py:9): time.sleep(600)'
    );
    expect(stallText({ ...job, state: 'succeeded' }, now)).toBeNull();
    expect(stallText({ ...job, stall: null }, now)).toBeNull();
  });
});
