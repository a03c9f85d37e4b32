import * as React from 'react';

import { CommandIds } from '../commands';
import {
  elapsedLabel,
  exitText,
  failedRankPrefix,
  formatBytes,
  formatDuration,
  formatPercent,
  idleGpuSeconds,
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
import { notebookName } from '../model/origin';
import { isFinal } from '../model/reducer';
import { stallText, stacksText } from '../model/stacks';
import { Job, Rank } from '../model/types';
import { JobBadges, ProgressBar, StateBadge } from './JobList';
import { LogViewer } from './LogViewer';
import { CurveCharts } from './CurveChart';
import { Sparkline } from './Sparkline';
import { usePanel } from './context';

/** The job's folded stacks, read when asked (a button): where its ranks are, or why not. */
function StacksView({ job }: { job: Job }) {
  const { api } = usePanel();
  const [text, setText] = React.useState<string | null>(null);
  React.useEffect(() => setText(null), [job.id]);
  const read = () => {
    setText('reading…');
    api.getStacks(job.id).then(
      report => setText(stacksText(report)),
      (error: Error) => setText(error.message)
    );
  };
  return (
    <>
      <button
        className="jp-mlc-button"
        onClick={read}
        aria-label={`Stacks of job ${job.name}`}
        title="Where every rank is: each thread's stack, identical ones folded (mlcluster stacks)"
      >
        Stacks
      </button>
      {text !== null && (
        <pre className="jp-mlc-stacks" aria-label={`Stacks of job ${job.name}`}>
          {text}
        </pre>
      )}
    </>
  );
}

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
  }, [api, job.id]);
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
  // A live value while the rank runs; afterwards only a history worth drawing.
  const value =
    rank.state === 'running' ? (rank.metrics?.[name] ?? null) : null;
  const values = presentValues(history[rank.rank], name);
  if (value === null && values.length < 2) {
    return null;
  }
  return (
    <div className="jp-mlc-metric">
      <div className="jp-mlc-metric-head">
        <span className="jp-mlc-metric-label">{label}</span>
        <span className="jp-mlc-metric-value">{format(value) || '–'}</span>
      </div>
      <Sparkline
        values={values}
        max={max}
        label={`${label} of rank ${rank.rank} over the last ${values.length} samples`}
      />
    </div>
  );
}

/** CPU and memory always; GPU only where a GPU reported something. */
const METRICS: Array<{
  name: MetricName;
  label: string;
  format: (v: number | null | undefined) => string;
  max?: number;
}> = [
  { name: 'cpu_percent', label: 'CPU', format: formatPercent, max: 100 },
  { name: 'memory_bytes', label: 'Memory', format: formatBytes },
  { name: 'gpu_util', label: 'GPU', format: formatPercent, max: 100 },
  { name: 'gpu_memory_bytes', label: 'GPU memory', format: formatBytes }
];

function RankRow({ rank, history }: { rank: Rank; history: MetricsHistory }) {
  const p = rank.progress;
  const progress =
    p && typeof p.step === 'number' && p.total ? p.step / p.total : null;
  return (
    <li
      className={`jp-mlc-rank jp-mlc-rank-${rank.state}`}
      aria-label={`Rank ${rank.rank}: ${rank.state}`}
      data-rank={rank.rank}
    >
      <div className="jp-mlc-rank-head">
        <span className="jp-mlc-rank-id">rank {rank.rank}</span>
        <StateBadge state={rank.state} />
        {exitText(rank.exit_code) && (
          <span className="jp-mlc-hint jp-mlc-rank-exit">
            {exitText(rank.exit_code)}
          </span>
        )}
        {rank.host && (
          <span className="jp-mlc-hint jp-mlc-rank-host" title={rank.host}>
            {rank.host}
          </span>
        )}
      </div>
      <div className="jp-mlc-rank-metrics">
        {METRICS.map(m => (
          <MetricCell key={m.name} rank={rank} history={history} {...m} />
        ))}
      </div>
      {p && (
        <div className="jp-mlc-rank-progress">
          <ProgressBar value={progress} label={`Rank ${rank.rank} progress`} />
          <span className="jp-mlc-hint jp-mlc-rank-progress-text">
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

function NotebookField({ job }: { job: Job }) {
  const { notebookPath, openNotebook } = usePanel();
  const name = notebookName(job.origin);
  if (!name) {
    return null;
  }
  const path = notebookPath?.(job.origin) ?? null;
  return (
    <Field label="Notebook">
      {path && openNotebook ? (
        <button
          className="jp-mlc-link"
          onClick={() => openNotebook(path)}
          aria-label={`Open notebook ${path}`}
          title={`Open ${path}`}
        >
          {path}
        </button>
      ) : (
        <span title={job.origin?.notebook ?? undefined}>{name}</span>
      )}
    </Field>
  );
}

export function JobDetail({ job, now }: { job: Job; now: number }) {
  const { commands, store } = usePanel();
  const history = useMetrics(job);
  const heading = React.useRef<HTMLHeadingElement>(null);
  React.useEffect(() => heading.current?.focus(), [job.id]);
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
        <JobBadges job={job} now={now} />
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
            void commands.execute(CommandIds.openTensorBoard, { id: job.id })
          }
          aria-label={`Open TensorBoard of job ${job.name}`}
          title="Open the job's TensorBoard ($MLCLUSTER_TENSORBOARD_DIR) in a tab"
        >
          TensorBoard
        </button>
        {Object.keys(store.state.jobs).length > 1 && (
          <button
            className="jp-mlc-button"
            onClick={() =>
              void commands.execute(CommandIds.compareTensorBoard, {
                id: job.id
              })
            }
            aria-label={`Compare job ${job.name} with other jobs in TensorBoard`}
            title="Open one TensorBoard over this job and others you choose (one run per job)"
          >
            Compare…
          </button>
        )}
        <button
          className="jp-mlc-button"
          onClick={() =>
            void commands.execute(CommandIds.exportJob, { id: job.id })
          }
          aria-label={`Export job ${job.name}`}
          title="Download what runs this job again outside the notebook: a script, an sbatch file, a TrainJob or a PyTorchJob"
        >
          Export…
        </button>
        <button
          className="jp-mlc-button"
          onClick={() =>
            void commands.execute(CommandIds.deleteJob, { id: job.id })
          }
          aria-label={`Delete job ${job.name}`}
        >
          Delete
        </button>
        <StacksView job={job} />
      </div>
      {job.error && (
        <div className="jp-mlc-banner jp-mlc-banner-error" role="alert">
          {failedRankPrefix(job) && <strong>{failedRankPrefix(job)}</strong>}
          <pre className="jp-mlc-error-text">{job.error}</pre>
        </div>
      )}
      {job.reason && !isFinal(job) && (
        <div className="jp-mlc-banner">{job.reason}</div>
      )}
      {stallText(job, now) !== null && (
        <div className="jp-mlc-banner jp-mlc-banner-warn" role="alert">
          {stallText(job, now)}
        </div>
      )}
      {idleGpuSeconds(job, now) !== null && (
        <div className="jp-mlc-banner jp-mlc-banner-warn">
          Idle GPUs: every GPU of this job has been nearly unused for{' '}
          {formatDuration(idleGpuSeconds(job, now))}. Cancel it to free them?
        </div>
      )}
      {job.attempts.length > 0 && (
        <ol className="jp-mlc-attempts" aria-label="Attempts">
          {job.attempts.map(a => (
            <li key={`${a.attempt}-${a.started}`}>
              {`attempt ${a.attempt}: ${a.outcome}`}
              {a.reason ? `: ${a.reason}` : ''}
              {a.restarted ? '; restarted' : ''}
            </li>
          ))}
          {!isFinal(job) && <li>{`attempt ${job.restarts}: ${job.state}`}</li>}
        </ol>
      )}
      <dl className="jp-mlc-fields">
        <Field label="Ranks">{rankSummary(job)}</Field>
        <Field label="Backend">
          {job.backend}
          {job.framework ? ` · ${job.framework}` : ''}
        </Field>
        <Field label={elapsedLabel(job)}>{elapsed}</Field>
        <NotebookField job={job} />
        <Field label="Id">
          <code>{job.id}</code>
        </Field>
      </dl>
      <h4 className="jp-mlc-subtitle" id={`jp-mlc-ranks-${job.id}`}>
        Ranks
      </h4>
      <ul className="jp-mlc-ranks" aria-labelledby={`jp-mlc-ranks-${job.id}`}>
        {job.ranks.map(rank => (
          <RankRow key={rank.rank} rank={rank} history={history} />
        ))}
      </ul>
      <CurveCharts job={job} />
      <LogViewer job={job} />
    </div>
  );
}
