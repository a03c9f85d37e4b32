/**
 * Where a job's ranks are (issue 33): the folded stacks of `GET /jobs/{id}/stacks` as the
 * job view shows them, and a running job's stall as its banner says it.
 */
import { formatDuration } from './format';
import type { Job, StackReport } from './types';

/** One line per fold ('ranks 0, 2: all_reduce ← step (train.py:42): ...'), the header first;
 * ranks that could not be read are said, never left out. */
export function stacksText(report: StackReport): string {
  const state = report.live ? 'live' : `kept (${report.why})`;
  const lines = [
    `${state}, ${report.taken}, read by ${report.readers.join(', ') || 'no reader'}`
  ];
  if (!report.complete) {
    lines.push(
      'INCOMPLETE: ' +
        report.missing.map(m => `rank ${m.rank}: ${m.why}`).join('; ')
    );
  }
  for (const fold of report.folds) {
    lines.push(fold.text);
  }
  return lines.join('\n');
}

/** 'Ranks 1, 3 stalled for 5m 2s: ...' while the running job has stalled ranks, else null. */
export function stallText(
  job: Pick<Job, 'state' | 'stall'>,
  now: number = Date.now()
): string | null {
  const stall = job.state === 'running' ? job.stall : null;
  if (!stall) {
    return null;
  }
  const since = Date.parse(stall.since);
  const ranks = stall.ranks.join(', ');
  const who = stall.ranks.length > 1 ? `Ranks ${ranks}` : `Rank ${ranks}`;
  const age = Number.isNaN(since)
    ? ''
    : ` for ${formatDuration((now - since) / 1000)}`;
  const where = stall.where.length ? `: ${stall.where.join('; ')}` : '';
  return `${who} stalled (no output, progress or CPU)${age}${where}`;
}
