import * as React from 'react';

import { CommandIds } from '../commands';
import {
  formatBytes,
  formatDuration,
  formatPercent,
  jobElapsed,
  rankSummary
} from '../model/format';
import {
  MetricName,
  MetricsHistory,
  appendJobMetrics,
  mergeHistory,
  presentValues
} from '../model/metrics';
import { isFinal } from '../model/reducer';
import { Job, Rank } from '../model/types';
import { ProgressBar, StateBadge } from './JobList';
import { LogViewer } from './LogViewer';
import { Sparkline } from './Sparkline';
import { usePanel } from './context';

/** Metric history of one job: loaded once, then extended by each update of the job. */
function useMetrics(job: Job): MetricsHistory {
  const { api } = usePanel();
  const [history, setHistory] = React.useState<MetricsHistory>({});
  React.useEffect(() => {
    let cancelled = false;
    setHistory({});
    api.getMetrics(job.id).then(
      loaded =>
        !cancelled && setHistory(current => mergeHistory(loaded, current)),
      () => undefined // no history (yet): the live points still draw
    );
    return () => {
      cancelled = true;
    };
  }, [job.id]);
  React.useEffect(() => {
    setHistory(current => appendJobMetrics(current, job));
  }, [job]);
  return history;
}

function MetricCell({
  rank,
  history,
  name,
  label,
  format,
  max
}: {
  rank: Rank;
  history: MetricsHistory;
  name: MetricName;
  label: string;
  format: (v: number | null | undefined) => string;
  max?: number;
}) {
  const value = rank.metrics?.[name] ?? null;
  const values = presentValues(history[rank.rank], name);
  if (value === null && values.length === 0) {
    return null;
  }
  return (
    <span className="jp-mlc-metric">
      <span className="jp-mlc-metric-label">{label}</span>
      <span className="jp-mlc-metric-value">{format(value) || '–'}</span>
      {values.length > 1 && (
        <Sparkline
          values={values}
          max={max}
          label={`${label} of rank ${rank.rank} over the last ${values.length} samples`}
        />
      )}
    </span>
  );
}

function RankRow({ rank, history }: { rank: Rank; history: MetricsHistory }) {
  const p = rank.progress;
  const progress = p && p.total ? p.step / p.total : null;
  return (
    <li className="jp-mlc-rank" aria-label={`Rank ${rank.rank}: ${rank.state}`}>
      <div className="jp-mlc-rank-head">
        <span className="jp-mlc-rank-id">rank {rank.rank}</span>
        <StateBadge state={rank.state} />
        {rank.exit_code !== null && rank.exit_code !== undefined && (
          <span className="jp-mlc-hint">exit {rank.exit_code}</span>
        )}
        {rank.host && (
          <span className="jp-mlc-hint jp-mlc-rank-host">{rank.host}</span>
        )}
      </div>
      <div className="jp-mlc-rank-metrics">
        <MetricCell
          rank={rank}
          history={history}
          name="cpu_percent"
          label="CPU"
          format={formatPercent}
        />
        <MetricCell
          rank={rank}
          history={history}
          name="memory_bytes"
          label="Mem"
          format={formatBytes}
        />
        <MetricCell
          rank={rank}
          history={history}
          name="gpu_util"
          label="GPU"
          format={formatPercent}
          max={100}
        />
        <MetricCell
          rank={rank}
          history={history}
          name="gpu_memory_bytes"
          label="GPU mem"
          format={formatBytes}
        />
      </div>
      {p && (
        <div className="jp-mlc-rank-progress">
          <ProgressBar value={progress} label={`Rank ${rank.rank} progress`} />
          <span className="jp-mlc-hint">
            {p.desc ? `${p.desc} ` : ''}
            {p.step}
            {p.total ? `/${p.total}` : ''}
          </span>
        </div>
      )}
    </li>
  );
}

function Field({
  label,
  children
}: {
  label: string;
  children: React.ReactNode;
}) {
  return (
    <>
      <dt>{label}</dt>
      <dd>{children}</dd>
    </>
  );
}

export function JobDetail({ job, now }: { job: Job; now: number }) {
  const { commands, openNotebook, store } = usePanel();
  const history = useMetrics(job);
  const heading = React.useRef<HTMLHeadingElement>(null);
  React.useEffect(() => heading.current?.focus(), [job.id]);
  const notebook = job.origin?.notebook;
  const elapsed = formatDuration(jobElapsed(job, now));

  return (
    <div
      className="jp-mlc-detail"
      onKeyDown={e => {
        if (e.key === 'Escape') {
          e.stopPropagation();
          store.select(null);
        }
      }}
    >
      <div className="jp-mlc-detail-head">
        <button
          className="jp-mlc-button jp-mlc-button-small"
          onClick={() => store.select(null)}
          aria-label="Back to all jobs"
          title="Back to all jobs (Escape)"
        >
          ←
        </button>
        <h3 className="jp-mlc-detail-title" tabIndex={-1} ref={heading}>
          {job.name}
        </h3>
        <StateBadge state={job.state} />
      </div>
      <div className="jp-mlc-actions">
        {!isFinal(job) && (
          <button
            className="jp-mlc-button jp-mlc-button-warn"
            onClick={() =>
              void commands.execute(CommandIds.cancelJob, { id: job.id })
            }
            aria-label={`Cancel job ${job.name}`}
          >
            Cancel
          </button>
        )}
        <button
          className="jp-mlc-button"
          onClick={() =>
            void commands.execute(CommandIds.deleteJob, { id: job.id })
          }
          aria-label={`Delete job ${job.name}`}
        >
          Delete
        </button>
        {notebook && openNotebook && (
          <button
            className="jp-mlc-button"
            onClick={() => openNotebook(notebook)}
            aria-label={`Open notebook ${notebook}`}
            title={notebook}
          >
            Open notebook
          </button>
        )}
      </div>
      {job.error && (
        <div className="jp-mlc-banner jp-mlc-banner-error" role="alert">
          {typeof job.failed_rank === 'number' && (
            <strong>Rank {job.failed_rank}: </strong>
          )}
          <pre className="jp-mlc-error-text">{job.error}</pre>
        </div>
      )}
      {job.reason && !isFinal(job) && (
        <div className="jp-mlc-banner">{job.reason}</div>
      )}
      <dl className="jp-mlc-fields">
        <Field label="Ranks">{rankSummary(job)}</Field>
        <Field label="Backend">
          {job.backend}
          {job.framework ? ` · ${job.framework}` : ''}
        </Field>
        <Field label={job.started ? 'Elapsed' : 'Waiting'}>{elapsed}</Field>
        <Field label="Id">
          <code>{job.id}</code>
        </Field>
        {notebook && <Field label="Notebook">{notebook}</Field>}
      </dl>
      <ul className="jp-mlc-ranks" aria-label="Ranks">
        {job.ranks.map(rank => (
          <RankRow key={rank.rank} rank={rank} history={history} />
        ))}
      </ul>
      <LogViewer job={job} />
    </div>
  );
}
