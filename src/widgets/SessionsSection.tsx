import * as React from 'react';

import { formatAge, formatBytes, rankSummary } from '../model/format';
import { Job, Session } from '../model/types';
import { useAction, usePanel } from './context';

/** How often the section asks for the sessions while it is shown (their cells, memory and
 * idle time change without a job event of their own). */
const REFRESH_MS = 5000;

/**
 * A cheap fingerprint of the session jobs the store holds: when a session's gang or one of
 * its cells changes (a cell starts or ends, a session is stopped elsewhere), the list is
 * asked for again at once instead of at the next refresh.
 */
function sessionNews(jobs: Readonly<Record<string, Job>>): string {
  return Object.values(jobs)
    .filter(job => job.session)
    .map(job => `${job.id}:${job.state}`)
    .sort()
    .join(',');
}

function SessionRow({
  session,
  now,
  onChange
}: {
  session: Session;
  now: number;
  onChange: () => void;
}) {
  const { api } = usePanel();
  const { busy, error, act } = useAction(onChange);
  const ranks = rankSummary({
    state: session.state,
    workers: session.workers,
    ranks: session.ranks,
    failed_rank: null,
    queue_position: null
  });
  return (
    <li
      className="jp-mlc-session"
      aria-label={`Session ${session.name}: ${session.state}`}
    >
      <div className="jp-mlc-nb-head">
        <span className="jp-mlc-job-name">{session.name}</span>
        <span className={`jp-mlc-state jp-mlc-state-${session.state}`}>
          <span className="jp-mlc-state-dot" aria-hidden="true" />
          {session.state}
        </span>
      </div>
      <div className="jp-mlc-hint jp-mlc-session-facts">
        <span>{ranks}</span>
        {session.gpus > 0 && <span> · {session.gpus} GPUs</span>}
        {session.memory_bytes !== null && (
          <span> · {formatBytes(session.memory_bytes)}</span>
        )}
        <span>
          {' '}
          · {session.cells} {session.cells === 1 ? 'cell' : 'cells'}
        </span>
        {session.idle_since && (
          <span> · idle {formatAge(session.idle_since, now)}</span>
        )}
      </div>
      {error && (
        <div className="jp-mlc-banner jp-mlc-banner-error" role="alert">
          {error}
        </div>
      )}
      <div className="jp-mlc-actions">
        <button
          className="jp-mlc-button"
          disabled={busy}
          onClick={() => act(() => api.restartSession(session.name))}
          aria-label={`Restart session ${session.name}`}
        >
          Restart
        </button>
        <button
          className="jp-mlc-button"
          disabled={busy}
          onClick={() => act(() => api.stopSession(session.name))}
          aria-label={`Stop session ${session.name}`}
        >
          Stop
        </button>
      </div>
    </li>
  );
}

export function SessionsSection({
  jobs,
  now
}: {
  jobs: Readonly<Record<string, Job>>;
  now: number;
}) {
  const { api } = usePanel();
  const [sessions, setSessions] = React.useState<Session[] | null>(null);
  const [error, setError] = React.useState<string | null>(null);
  const [asked, setAsked] = React.useState(0);
  const news = sessionNews(jobs);
  React.useEffect(() => {
    let live = true;
    api.listSessions().then(
      list => {
        if (live) {
          setSessions(list);
          setError(null);
        }
      },
      e => {
        if (live) {
          setError(String((e as Error).message ?? e));
        }
      }
    );
    return () => {
      live = false;
    };
  }, [api, news, asked]);
  React.useEffect(() => {
    const timer = setInterval(() => setAsked(n => n + 1), REFRESH_MS);
    return () => clearInterval(timer);
  }, []);
  if (error && sessions === null) {
    return (
      <div className="jp-mlc-banner jp-mlc-banner-error" role="alert">
        {error}
      </div>
    );
  }
  if (sessions === null) {
    return <div className="jp-mlc-hint">Loading…</div>;
  }
  if (sessions.length === 0) {
    return (
      <div className="jp-mlc-hint">
        No live sessions. <code>%%distributed --session NAME</code> starts one.
      </div>
    );
  }
  return (
    <ul className="jp-mlc-nb-list" aria-label="Sessions">
      {sessions.map(session => (
        <SessionRow
          key={session.name}
          session={session}
          now={now}
          onChange={() => setAsked(n => n + 1)}
        />
      ))}
    </ul>
  );
}
