import * as React from 'react';

import { formatBytes } from '../model/format';
import { PanelState, queuedJobs } from '../model/reducer';
import { Capacity, Cluster } from '../model/types';
import { onActivate, usePanel } from './context';

function CapacityBar({
  label,
  capacity,
  format = String
}: {
  label: string;
  capacity?: Capacity;
  format?: (n: number) => string;
}) {
  if (!capacity) {
    return null;
  }
  const { total, free } = capacity;
  // null: the backend cannot tell (e.g. a cluster that reports no capacity)
  const measured = total !== null && free !== null && total > 0;
  const used = measured ? Math.max(0, total - free) : 0;
  const fraction = measured ? used / total : 0;
  let text = total === null || free === null ? 'unknown' : 'none';
  if (measured) {
    text = `${format(used)} of ${format(total)} allocated`;
  }
  return (
    <div
      className={`jp-mlc-capacity${measured ? '' : ' jp-mlc-capacity-none'}`}
    >
      <div className="jp-mlc-capacity-label">
        <span>{label}</span>
        <span>{text}</span>
      </div>
      {measured && (
        <div
          className="jp-mlc-meter"
          role="meter"
          aria-label={`${label}: ${text}`}
          aria-valuemin={0}
          aria-valuemax={total}
          aria-valuenow={used}
        >
          <div
            className={`jp-mlc-meter-fill${fraction >= 0.9 ? ' jp-mlc-meter-full' : ''}`}
            style={{ width: `${fraction * 100}%` }}
          />
        </div>
      )}
    </div>
  );
}

type Partition = NonNullable<Cluster['partitions']>[number];

function idleOf(capacity: Partition['cpus'], unit: string): string {
  const { total, free } = capacity;
  if (total === null || free === null) {
    return `? ${unit}`;
  }
  return `${free} of ${total} ${unit} idle`;
}

/** Every Slurm partition's idle CPUs and GPUs, as sinfo tells them (the bars above are the
 * default partition's). */
function Partitions({ partitions }: { partitions: Partition[] }) {
  return (
    <div className="jp-mlc-partitions">
      <div className="jp-mlc-subtitle">Partitions</div>
      <ul aria-label="Partitions">
        {partitions.map(p => (
          <li key={p.name} data-partition={p.name}>
            <span className="jp-mlc-job-name">
              {p.name}
              {p.default ? ' (default)' : ''}
            </span>
            <span className="jp-mlc-hint jp-mlc-partition-idle">
              {idleOf(p.cpus, 'CPUs')}
              {p.gpus.total ? `, ${idleOf(p.gpus, 'GPUs')}` : ''}
            </span>
          </li>
        ))}
      </ul>
    </div>
  );
}

export function ClusterSection({ state }: { state: PanelState }) {
  const { store } = usePanel();
  const cluster = state.cluster;
  if (!cluster) {
    return (
      <div className="jp-mlc-hint">
        {store.problem
          ? 'Unavailable until the server extension answers.'
          : 'Loading…'}
      </div>
    );
  }
  const queue = queuedJobs(state);
  const cpus = (n: number) => String(Math.round(n * 10) / 10);
  return (
    <div className="jp-mlc-cluster">
      <div className="jp-mlc-cluster-backend">
        Backend: <strong>{cluster.backend}</strong>
      </div>
      <CapacityBar label="GPUs" capacity={cluster.capacity?.gpus} />
      <CapacityBar
        label="CPUs"
        capacity={cluster.capacity?.cpus}
        format={cpus}
      />
      <CapacityBar
        label="Memory"
        capacity={cluster.capacity?.memory}
        format={formatBytes}
      />
      {cluster.partitions && cluster.partitions.length > 0 && (
        <Partitions partitions={cluster.partitions} />
      )}
      <div className="jp-mlc-queue">
        <div className="jp-mlc-subtitle">Queue ({queue.length})</div>
        {queue.length === 0 ? (
          <div className="jp-mlc-hint">Nothing is waiting.</div>
        ) : (
          <ol className="jp-mlc-queue-list" aria-label="Queued jobs">
            {queue.map(job => {
              const open = () => store.select(job.id);
              const name = 'name' in job ? job.name : job.id;
              const reason = 'reason' in job ? job.reason : null;
              return (
                <li
                  key={job.id}
                  tabIndex={0}
                  role="button"
                  aria-label={`Queued job ${name}${reason ? `: ${reason}` : ''}`}
                  onClick={open}
                  onKeyDown={onActivate(open)}
                >
                  <span className="jp-mlc-job-name">{name}</span>
                  {reason && (
                    <span className="jp-mlc-hint jp-mlc-queue-reason">
                      {reason}
                    </span>
                  )}
                </li>
              );
            })}
          </ol>
        )}
      </div>
    </div>
  );
}
