import * as React from 'react';

import { formatBytes } from '../model/format';
import { PanelState, queuedJobs } from '../model/reducer';
import { Capacity } from '../model/types';
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
  const used = Math.max(0, capacity.total - capacity.free);
  const fraction = capacity.total > 0 ? used / capacity.total : 0;
  const text = `${format(used)} of ${format(capacity.total)} in use`;
  return (
    <div className="jp-mlc-capacity">
      <div className="jp-mlc-capacity-label">
        <span>{label}</span>
        <span>{capacity.total > 0 ? text : 'none'}</span>
      </div>
      <div
        className="jp-mlc-meter"
        role="meter"
        aria-label={`${label}: ${text}`}
        aria-valuemin={0}
        aria-valuemax={capacity.total}
        aria-valuenow={used}
      >
        <div
          className={`jp-mlc-meter-fill${fraction >= 0.9 ? ' jp-mlc-meter-full' : ''}`}
          style={{ width: `${fraction * 100}%` }}
        />
      </div>
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
                  {reason && <span className="jp-mlc-hint"> {reason}</span>}
                </li>
              );
            })}
          </ol>
        )}
      </div>
    </div>
  );
}
