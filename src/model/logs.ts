/**
 * Following a job's logs: catch up page by page with the `since` cursor, then stream
 * (`follow=true`, NDJSON) while the job runs; after a broken stream, resume from the
 * cursor when the server sent one, else reload from the start.
 */
import { MlclusterApi } from './api';
import {
  BackoffOptions,
  DEFAULT_BACKOFF,
  backoffDelay,
  sleep
} from './backoff';
import { LogLine } from './types';

export type FollowState =
  'loading' | 'following' | 'reconnecting' | 'done' | 'error';

export interface LogSink {
  /** New lines, oldest first. */
  append(lines: LogLine[]): void;
  /** Forget what was appended: everything is about to be sent again. */
  reset(): void;
  status?(state: FollowState, error?: string): void;
}

export interface FollowOptions {
  /** Is the job still producing logs? Checked before each (re)connect of the stream. */
  isActive: () => boolean;
  rank?: number | null;
  signal: AbortSignal;
  backoff?: BackoffOptions;
  /** Give up streaming after this many failures in a row (then poll no more: `error`). */
  maxFailures?: number;
}

/** A streamed object: a log line, possibly carrying the cursor just after it. */
type StreamItem = Partial<LogLine> & { cursor?: string };

export async function followLogs(
  api: MlclusterApi,
  jobId: string,
  sink: LogSink,
  options: FollowOptions
): Promise<void> {
  const { signal } = options;
  const maxFailures = options.maxFailures ?? 8;
  let cursor: string | undefined;

  // Pages until one comes back empty: one answer holds a few MiB at most.
  const catchUp = async () => {
    for (;;) {
      const page = await api.getLogs(jobId, {
        since: cursor,
        rank: options.rank
      });
      if (signal.aborted) {
        return;
      }
      if (page.lines.length) {
        sink.append(page.lines);
      }
      const moved = page.cursor !== cursor;
      cursor = page.cursor;
      if (!page.lines.length || !moved) {
        return;
      }
    }
  };

  sink.status?.('loading');
  let failures = 0;
  // False while lines have been streamed past the last cursor the server told us.
  let cursorTrusted = true;
  while (!signal.aborted) {
    try {
      if (!cursorTrusted) {
        sink.reset();
        cursor = undefined;
        cursorTrusted = true;
      }
      await catchUp();
      if (signal.aborted || !options.isActive()) {
        break;
      }
      sink.status?.('following');
      for await (const batch of api.followLogs(jobId, {
        since: cursor,
        rank: options.rank,
        signal
      })) {
        const lines: LogLine[] = [];
        for (const item of batch as StreamItem[]) {
          if (typeof item.line === 'string') {
            lines.push(item as LogLine);
            cursorTrusted = false;
          }
          if (typeof item.cursor === 'string') {
            cursor = item.cursor;
            cursorTrusted = true;
          }
        }
        if (lines.length) {
          sink.append(lines);
        }
        failures = 0;
      }
      // The stream ended: the job ended, or the server went away mid-job.
      if (!options.isActive()) {
        if (cursorTrusted) {
          await catchUp(); // anything written between the stream's end and the job's
        }
        break;
      }
      // Still active as far as we know (its final event may be on its way): don't spin.
      await sleep(backoffDelay(0, options.backoff ?? DEFAULT_BACKOFF), signal);
    } catch (error) {
      if (signal.aborted) {
        break;
      }
      failures++;
      const message = String((error as Error)?.message ?? error);
      if (failures >= maxFailures) {
        sink.status?.('error', message);
        return;
      }
      sink.status?.('reconnecting', message);
      await sleep(
        backoffDelay(failures - 1, options.backoff ?? DEFAULT_BACKOFF),
        signal
      );
    }
  }
  if (!signal.aborted) {
    sink.status?.('done');
  }
}
