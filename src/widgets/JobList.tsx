import * as React from 'react';

import { formatAge, jobProgress, rankSummary } from '../model/format';
import { Job } from '../model/types';
import { onActivate, usePanel } from './context';

export function StateBadge({ state }: { state: string }) {
  return (
    <span className={`jp-mlc-state jp-mlc-state-${state}`}>
      <span className="jp-mlc-state-dot" aria-hidden="true" />
      {state}
    </span>
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

function JobRow({ job, now }: { job: Job; now: number }) {
  const { store } = usePanel();
  const ranks = rankSummary(job);
  const age = formatAge(job.created, now);
  const open = () => store.select(job.id);
  return (
    <li className="jp-mlc-job-row-item">
      <div
        className={`jp-mlc-job-row jp-mlc-job-${job.state}`}
        role="button"
        tabIndex={0}
        data-job-id={job.id}
        aria-label={`Job ${job.name}: ${job.state}, ${ranks}, ${job.backend} backend, created ${age} ago. Press Enter for details.`}
        onClick={open}
        onKeyDown={onActivate(open)}
      >
        <div className="jp-mlc-job-row-main">
          <span className="jp-mlc-job-name" title={`${job.name} (${job.id})`}>
            {job.name}
          </span>
          <StateBadge state={job.state} />
        </div>
        <div className="jp-mlc-job-row-meta">
          <span className="jp-mlc-job-ranks">{ranks}</span>
          <span className="jp-mlc-job-backend">{job.backend}</span>
          <span className="jp-mlc-job-age" title={job.created}>
            {age}
          </span>
        </div>
        <ProgressBar value={jobProgress(job)} label={`${job.name} progress`} />
      </div>
    </li>
  );
}

export function JobList({ jobs, now }: { jobs: Job[]; now: number }) {
  if (jobs.length === 0) {
    return (
      <div className="jp-mlc-empty">
        <p>No distributed jobs yet.</p>
        <p className="jp-mlc-hint">
          Put <code>%%distributed --workers 2</code> on top of a notebook cell
          and run it; the job shows up here.
        </p>
      </div>
    );
  }
  return (
    <ul className="jp-mlc-job-list" aria-label="Distributed jobs">
      {jobs.map(job => (
        <JobRow key={job.id} job={job} now={now} />
      ))}
    </ul>
  );
}
