/** How numbers, times and jobs read in the sidebar. Pure functions. */
import { FINAL_JOB_STATES, Job, RankState } from './types';

/** Seconds -> "45s", "3m 05s", "2h 04m", "3d 4h". Negative or missing -> "". */
export function formatDuration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) {
    return '';
  }
  if (seconds < 0) {
    return '';
  }
  const s = Math.floor(seconds);
  if (s < 60) {
    return `${s}s`;
  }
  const pad = (n: number) => String(n).padStart(2, '0');
  if (s < 3600) {
    return `${Math.floor(s / 60)}m ${pad(s % 60)}s`;
  }
  if (s < 86400) {
    return `${Math.floor(s / 3600)}h ${pad(Math.floor((s % 3600) / 60))}m`;
  }
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

/** Milliseconds since the epoch of an RFC 3339 time, or null when absent or unreadable. */
export function parseTime(value: string | null | undefined): number | null {
  if (!value) {
    return null;
  }
  const ms = Date.parse(value);
  return isNaN(ms) ? null : ms;
}

/** How long ago, compactly: "just now", "42s", "5m", "3h", "2d", "5w". */
export function formatAge(
  time: string | null | undefined,
  now: number = Date.now()
): string {
  const then = parseTime(time);
  if (then === null) {
    return '';
  }
  const s = Math.max(0, Math.floor((now - then) / 1000));
  if (s < 5) {
    return 'just now';
  }
  if (s < 60) {
    return `${s}s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)}m`;
  }
  if (s < 86400) {
    return `${Math.floor(s / 3600)}h`;
  }
  if (s < 7 * 86400) {
    return `${Math.floor(s / 86400)}d`;
  }
  return `${Math.floor(s / (7 * 86400))}w`;
}

const BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

/** Bytes -> "512 B", "1.5 KiB", "298 MiB", "12.0 GiB" (binary units, 3 significant digits). */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined || !isFinite(bytes) || bytes < 0) {
    return '';
  }
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < BYTE_UNITS.length - 1) {
    value /= 1024;
    unit++;
  }
  if (unit === 0) {
    return `${value} B`;
  }
  const digits = value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return `${value.toFixed(digits)} ${BYTE_UNITS[unit]}`;
}

/** 97.4 -> "97%"; null -> "". */
export function formatPercent(value: number | null | undefined): string {
  if (value === null || value === undefined || !isFinite(value)) {
    return '';
  }
  return `${Math.round(value)}%`;
}

/** How long the job has run (until now while it runs), or waited while queued. */
export function jobElapsed(
  job: Pick<Job, 'created' | 'started' | 'finished'>,
  now: number = Date.now()
): number | null {
  const start = parseTime(job.started) ?? parseTime(job.created);
  if (start === null) {
    return null;
  }
  const end = parseTime(job.finished) ?? now;
  return Math.max(0, (end - start) / 1000);
}

function count(job: Pick<Job, 'ranks'>, state: RankState): number {
  return job.ranks.filter(r => r.state === state).length;
}

/**
 * One phrase for where the ranks are: "3/4 running", "2/4 starting", "queued (#2)",
 * "4/4 succeeded", "rank 2 failed", "cancelled".
 */
export function rankSummary(
  job: Pick<
    Job,
    'state' | 'workers' | 'ranks' | 'failed_rank' | 'queue_position'
  >
): string {
  const total = job.workers || job.ranks.length;
  switch (job.state) {
    case 'queued':
      return typeof job.queue_position === 'number'
        ? `queued (#${job.queue_position + 1})`
        : 'queued';
    case 'starting': {
      const up = count(job, 'starting') + count(job, 'running');
      return `${up}/${total} starting`;
    }
    case 'running':
      return `${count(job, 'running')}/${total} running`;
    case 'succeeded':
      return `${count(job, 'succeeded')}/${total} succeeded`;
    case 'failed': {
      if (typeof job.failed_rank === 'number') {
        return `rank ${job.failed_rank} failed`;
      }
      const failed = count(job, 'failed');
      return failed ? `${failed}/${total} failed` : 'failed';
    }
    case 'cancelled':
      return 'cancelled';
    default:
      return String(job.state);
  }
}

/** Overall progress 0..1 from rank 0's (or the first reporting rank's) progress, if any. */
export function jobProgress(job: Pick<Job, 'ranks'>): number | null {
  for (const rank of job.ranks) {
    const p = rank.progress;
    if (p && typeof p.step === 'number' && p.total && p.total > 0) {
      return Math.min(1, Math.max(0, p.step / p.total));
    }
  }
  return null;
}

/** A message as a sentence: first letter upper case ("no cluster..." -> "No cluster..."). */
export function asSentence(message: string): string {
  return message.charAt(0).toUpperCase() + message.slice(1);
}

/**
 * How a rank ended, when it says something: "" for none yet or a clean exit (0), "exit 1",
 * "signal 15" (a negative code: the process was killed by that signal).
 */
export function exitText(code: number | null | undefined): string {
  if (code === null || code === undefined || code === 0) {
    return '';
  }
  return code < 0 ? `signal ${-code}` : `exit ${code}`;
}

/** What the detail view calls the job's time: waited so far, ran so far, or ran in all. */
export function elapsedLabel(
  job: Pick<Job, 'started' | 'finished' | 'state'>
): string {
  if (!job.started) {
    return FINAL_JOB_STATES.has(job.state) ? 'Waited' : 'Waiting';
  }
  return job.finished ? 'Duration' : 'Elapsed';
}

/** "Rank 2: " before a failed job's error, unless the error already names that rank. */
export function failedRankPrefix(
  job: Pick<Job, 'error' | 'failed_rank'>
): string {
  const rank = job.failed_rank;
  if (typeof rank !== 'number') {
    return '';
  }
  const named = new RegExp(`\\brank ${rank}\\b`, 'i').test(job.error ?? '');
  return named ? '' : `Rank ${rank}: `;
}

/**
 * How long a running job's GPUs have all been idle, once the server flagged it (every GPU
 * under MLClusterConfig.idle_gpu_percent for idle_gpu_after); null when it is not flagged.
 */
export function idleGpuSeconds(
  job: Pick<Job, 'state' | 'gpu_idle_since'>,
  now: number = Date.now()
): number | null {
  const since = job.state === 'running' ? parseTime(job.gpu_idle_since) : null;
  return since === null ? null : Math.max(0, (now - since) / 1000);
}
