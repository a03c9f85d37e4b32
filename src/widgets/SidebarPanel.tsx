import { ReactWidget } from '@jupyterlab/ui-components';
import * as React from 'react';

import { ConnectionStatus } from '../model/events';
import { sortedJobs } from '../model/reducer';
import { ClusterSection } from './ClusterSection';
import { JobDetail } from './JobDetail';
import { JobList } from './JobList';
import { NotebooksSection } from './NotebooksSection';
import { SessionsSection } from './SessionsSection';
import {
  PanelContext,
  PanelContextValue,
  useNow,
  usePanel,
  useStore
} from './context';

/** Which sections the user collapsed: kept while a job's details replace the sections. */
const SectionsContext = React.createContext<{
  collapsed: Readonly<Record<string, boolean>>;
  toggle: (id: string) => void;
}>({ collapsed: {}, toggle: () => undefined });

function Section({
  id,
  title,
  children
}: {
  id: string;
  title: React.ReactNode;
  children: React.ReactNode;
}) {
  const { collapsed, toggle } = React.useContext(SectionsContext);
  const open = !collapsed[id];
  const bodyId = `jp-mlc-section-${id}`;
  return (
    <section className="jp-mlc-section" aria-labelledby={`${bodyId}-title`}>
      <h3 className="jp-mlc-section-title" id={`${bodyId}-title`}>
        <button
          className="jp-mlc-section-toggle"
          aria-expanded={open}
          aria-controls={bodyId}
          onClick={() => toggle(id)}
        >
          <span className="jp-mlc-caret" aria-hidden="true">
            {open ? '▾' : '▸'}
          </span>
          {title}
        </button>
      </h3>
      {open && (
        <div className="jp-mlc-section-body" id={bodyId}>
          {children}
        </div>
      )}
    </section>
  );
}

function RetryButton() {
  const { store } = usePanel();
  return (
    <button
      className="jp-mlc-button jp-mlc-button-small"
      onClick={() => void store.refreshNow()}
    >
      Retry now
    </button>
  );
}

function ConnectionBanner({
  status,
  now
}: {
  status: ConnectionStatus;
  now: number;
}) {
  const { store } = usePanel();
  const problem = store.problem;
  if (problem) {
    return (
      <div className="jp-mlc-banner jp-mlc-banner-error" role="alert">
        <div>{problem.message}</div>
        <RetryButton />
      </div>
    );
  }
  if (status.state !== 'waiting') {
    return null;
  }
  const seconds = status.retryAt
    ? Math.max(0, Math.ceil((status.retryAt - now) / 1000))
    : 0;
  return (
    <div className="jp-mlc-banner jp-mlc-banner-warn" role="status">
      <div>
        Lost the connection to the server
        {status.lastError ? ` (${status.lastError})` : ''}. Reconnecting
        {seconds ? ` in ${seconds}s` : '…'}
      </div>
      <RetryButton />
    </div>
  );
}

const CONNECTION_TEXT: Record<string, string> = {
  open: 'live',
  connecting: 'connecting…',
  waiting: 'offline',
  stopped: 'not connected'
};

function Panel() {
  const { store } = usePanel();
  useStore(store);
  const now = useNow(1000);
  const { state } = store;
  const [collapsed, setCollapsed] = React.useState<Record<string, boolean>>({});
  const sections = React.useMemo(
    () => ({
      collapsed,
      toggle: (id: string) => setCollapsed(c => ({ ...c, [id]: !c[id] }))
    }),
    [collapsed]
  );
  const selected = store.selectedJob;
  const jobs = sortedJobs(state.jobs);
  const selectedJob = selected ? state.jobs[selected] : undefined;
  // Leaving a job's details puts focus back on its row, so keyboard users keep their place.
  const lastSelected = React.useRef<string | null>(null);
  const returnTo = selected ? null : lastSelected.current;
  lastSelected.current = selected;
  const connection =
    store.mode === 'poll'
      ? store.problem
        ? 'offline'
        : 'polling'
      : CONNECTION_TEXT[store.connection.state];

  return (
    <div className="jp-mlc-panel">
      <header className="jp-mlc-header">
        <h2 className="jp-mlc-title">Distributed jobs</h2>
        <span
          className={`jp-mlc-connection jp-mlc-connection-${connection.replace(/\W/g, '')}`}
          role="status"
          aria-label={`Updates: ${connection}`}
        >
          <span className="jp-mlc-state-dot" aria-hidden="true" />
          {connection}
        </span>
      </header>
      <ConnectionBanner status={store.connection} now={now} />
      {selected && selectedJob ? (
        <JobDetail job={selectedJob} now={now} />
      ) : selected ? (
        <div className="jp-mlc-empty">
          <p>This job no longer exists.</p>
          <button className="jp-mlc-button" onClick={() => store.select(null)}>
            Back to all jobs
          </button>
        </div>
      ) : (
        <SectionsContext.Provider value={sections}>
          <div className="jp-mlc-sections">
            <Section id="jobs" title={`Jobs (${jobs.length})`}>
              {state.synced || jobs.length ? (
                <JobList jobs={jobs} now={now} focusId={returnTo} />
              ) : (
                <div className="jp-mlc-hint">
                  {store.problem ? 'Jobs are unavailable.' : 'Loading…'}
                </div>
              )}
            </Section>
            <Section id="sessions" title="Sessions">
              <SessionsSection jobs={state.jobs} now={now} />
            </Section>
            <Section id="cluster" title="Cluster">
              <ClusterSection state={state} />
            </Section>
            <Section id="notebooks" title="Notebook servers">
              <NotebooksSection notebooks={state.notebooks} now={now} />
            </Section>
          </div>
        </SectionsContext.Provider>
      )}
    </div>
  );
}

/** The left sidebar panel. */
export class SidebarPanel extends ReactWidget {
  constructor(private panelContext: PanelContextValue) {
    super();
    this.addClass('jp-mlc-sidebar');
  }

  set settings(settings: PanelContextValue['settings']) {
    this.panelContext = { ...this.panelContext, settings };
    this.update();
  }

  render(): JSX.Element {
    return (
      <PanelContext.Provider value={this.panelContext}>
        <Panel />
      </PanelContext.Provider>
    );
  }
}
