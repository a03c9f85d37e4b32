import * as React from 'react';

import { CommandIds } from '../commands';
import {
  formatAge,
  formatDuration,
  idleGpuSeconds,
  jobProgress,
  rankSummary
} from '../model/format';
import { listMove } from '../model/navigation';
import { notebookName } from '../model/origin';
import { Job } from '../model/types';
import { usePanel } from './context';

export function StateBadge({ state }: { state: string }) {
  return (
    <span className={`jp-mlc-state jp-mlc-state-${state}`}>
      <span className="jp-mlc-state-dot" aria-hidden="true" />
      {state}
    </span>
  );
}

/** A running job flagged for idle GPUs (the server's `gpu_idle_since`), and for how long. */
export function IdleGpuBadge({ job, now }: { job: Job; now: number }) {
  const seconds = idleGpuSeconds(job, now);
  if (seconds === null) {
    return null;
  }
  return (
    <span
      className="jp-mlc-idle-gpus"
      title={`Every GPU of this job has been nearly unused for ${formatDuration(seconds)}`}
    >
      GPUs idle
    </span>
  );
}

/** What a job's row and its detail view show beside its name: idle GPUs, then the state. */
export function JobBadges({ job, now }: { job: Job; now: number }) {
  return (
    <>
      <IdleGpuBadge job={job} now={now} />
      <StateBadge state={job.state} />
    </>
  );
}

export function ProgressBar({
  value,
  label
}: {
  value: number | null;
  label: string;
}) {
  if (value === null) {
    return null;
  }
  return (
    <div
      className="jp-mlc-progress"
      role="progressbar"
      aria-label={label}
      aria-valuemin={0}
      aria-valuemax={100}
      aria-valuenow={Math.round(value * 100)}
    >
      <div
        className="jp-mlc-progress-fill"
        style={{ width: `${value * 100}%` }}
      />
    </div>
  );
}

function JobRow({
  job,
  now,
  tabbable,
  onFocus
}: {
  job: Job;
  now: number;
  /** The one row Tab stops at; arrows move between rows (a roving tab stop). */
  tabbable: boolean;
  onFocus: () => void;
}) {
  const { store, commands, settings, notebookPath, showOpenNotebook } =
    usePanel();
  const ranks = rankSummary(job);
  const age = formatAge(job.created, now);
  const notebook = notebookName(job.origin);
  const open = () => {
    store.select(job.id);
    const path = settings.revealNotebook ? notebookPath?.(job.origin) : null;
    if (path) {
      showOpenNotebook?.(path);
    }
  };
  const onKeyDown = (event: React.KeyboardEvent) => {
    if (event.key === 'Enter' || event.key === ' ') {
      event.preventDefault();
      open();
    } else if (event.key === 'Delete') {
      event.preventDefault();
      void commands.execute(CommandIds.deleteJob, { id: job.id });
    }
  };
  return (
    <li className="jp-mlc-job-row-item">
      <div
        className={`jp-mlc-job-row jp-mlc-job-${job.state}`}
        role="button"
        tabIndex={tabbable ? 0 : -1}
        data-job-id={job.id}
        aria-label={`Job ${job.name}: ${job.state}${idleGpuSeconds(job, now) === null ? '' : ', GPUs idle'}, ${ranks}, ${job.backend} backend${notebook ? `, from ${notebook}` : ''}, created ${age === 'just now' ? 'just now' : `${age} ago`}. Enter: details; Delete: delete.`}
        onClick={open}
        onKeyDown={onKeyDown}
        onFocus={onFocus}
      >
        <div className="jp-mlc-job-row-main">
          <span className="jp-mlc-job-name" title={`${job.name} (${job.id})`}>
            {job.name}
          </span>
          <JobBadges job={job} now={now} />
        </div>
        <div className="jp-mlc-job-row-meta">
          <span className="jp-mlc-job-ranks">{ranks}</span>
          <span className="jp-mlc-job-backend">{job.backend}</span>
          {notebook && (
            <span
              className="jp-mlc-job-notebook"
              title={job.origin?.notebook ?? undefined}
            >
              {notebook}
            </span>
          )}
          <span className="jp-mlc-job-age" title={job.created}>
            {age}
          </span>
        </div>
        <ProgressBar value={jobProgress(job)} label={`${job.name} progress`} />
      </div>
    </li>
  );
}

export function JobList({
  jobs,
  now,
  focusId
}: {
  jobs: Job[];
  now: number;
  /** The row to focus when the list appears (the job whose details were just left). */
  focusId?: string | null;
}) {
  const list = React.useRef<HTMLUListElement>(null);
  const [focusedId, setFocusedId] = React.useState<string | null>(
    focusId ?? null
  );
  // Tab enters the list at the row last focused (while it exists), else at the first.
  const tabStop = jobs.some(job => job.id === focusedId)
    ? focusedId
    : (jobs[0]?.id ?? null);
  React.useEffect(() => {
    if (focusId) {
      list.current
        ?.querySelector<HTMLElement>(`[data-job-id="${CSS.escape(focusId)}"]`)
        ?.focus();
    }
  }, []);

  if (jobs.length === 0) {
    return (
      <div className="jp-mlc-empty jp-mlc-empty-jobs">
        <p>No distributed jobs yet.</p>
        <p className="jp-mlc-hint">
          Put <code>%%distributed --workers 2</code> on top of a notebook cell
          and run it: the job shows up here.
        </p>
      </div>
    );
  }

  // Arrow keys, Home and End move between rows, as in JupyterLab's file browser.
  const onKeyDown = (event: React.KeyboardEvent) => {
    const rows = Array.from(
      list.current?.querySelectorAll<HTMLElement>('.jp-mlc-job-row') ?? []
    );
    const current = rows.indexOf(document.activeElement as HTMLElement);
    const next = listMove(event.key, current, rows.length);
    if (next !== null) {
      event.preventDefault();
      rows[next].focus();
    }
  };

  return (
    <ul
      className="jp-mlc-job-list"
      aria-label="Distributed jobs"
      ref={list}
      onKeyDown={onKeyDown}
    >
      {jobs.map(job => (
        <JobRow
          key={job.id}
          job={job}
          now={now}
          tabbable={job.id === tabStop}
          onFocus={() => setFocusedId(job.id)}
        />
      ))}
    </ul>
  );
}
