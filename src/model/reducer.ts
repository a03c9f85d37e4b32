/**
 * The sidebar's state, and how each message of the event stream changes it.
 *
 * Pure: `reduce(state, event)` returns a new state (or the same object when nothing
 * changed, so views can skip re-rendering).
 */
import {
  Cluster,
  FINAL_JOB_STATES,
  Job,
  NotebookServer,
  ServerEvent
} from './types';

export interface PanelState {
  jobs: Readonly<Record<string, Job>>;
  cluster: Cluster | null;
  /** null until the notebooks list has been loaded (or the API said it is unavailable). */
  notebooks: Readonly<Record<string, NotebookServer>> | null;
  /** A snapshot has arrived since the last (re)connect. */
  synced: boolean;
  /** The highest change-feed position applied, when the server numbers its messages. */
  seq: number | null;
  /**
   * Jobs deleted since the last snapshot: a late `job` message for one of them must not
   * bring it back.
   */
  deleted: Readonly<Record<string, true>>;
}

/** Things the panel itself learns (from REST answers) rather than from the event stream. */
export type LocalAction =
  | { type: 'notebooks_loaded'; notebooks: NotebookServer[] }
  | { type: 'disconnected' };

export type Action = ServerEvent | LocalAction;

export const initialState: PanelState = {
  jobs: {},
  cluster: null,
  notebooks: null,
  synced: false,
  seq: null,
  deleted: {}
};

export function isFinal(job: Pick<Job, 'state'>): boolean {
  return FINAL_JOB_STATES.has(job.state);
}

function byKey<T>(items: T[], key: (item: T) => string): Record<string, T> {
  const out: Record<string, T> = {};
  for (const item of items) {
    out[key(item)] = item;
  }
  return out;
}

function without<T>(
  record: Readonly<Record<string, T>>,
  key: string
): Record<string, T> {
  const rest = { ...record };
  delete rest[key];
  return rest;
}

/** Is this message older than what the state already reflects? */
function isStale(state: PanelState, event: ServerEvent): boolean {
  return (
    event.type !== 'snapshot' &&
    typeof event.seq === 'number' &&
    state.seq !== null &&
    event.seq <= state.seq
  );
}

function withSeq(state: PanelState, event: ServerEvent): PanelState {
  return typeof event.seq === 'number' ? { ...state, seq: event.seq } : state;
}

function applyJob(state: PanelState, job: Job): PanelState {
  if (state.deleted[job.id]) {
    return state;
  }
  const current = state.jobs[job.id];
  // A job never leaves a final state: an unnumbered message that says otherwise was
  // overtaken by a newer one.
  if (current && isFinal(current) && !isFinal(job)) {
    return state;
  }
  return { ...state, jobs: { ...state.jobs, [job.id]: job } };
}

export function reduce(state: PanelState, action: Action): PanelState {
  switch (action.type) {
    case 'snapshot':
      return {
        ...state,
        jobs: byKey(action.jobs ?? [], job => job.id),
        cluster: action.cluster ?? state.cluster,
        synced: true,
        seq: typeof action.seq === 'number' ? action.seq : null,
        deleted: {}
      };
    case 'disconnected':
      return state.synced ? { ...state, synced: false } : state;
    case 'notebooks_loaded':
      return {
        ...state,
        notebooks: byKey(action.notebooks, nb => nb.name)
      };
    default:
      break;
  }
  if (isStale(state, action)) {
    return state;
  }
  switch (action.type) {
    case 'job':
      return withSeq(applyJob(state, action.job), action);
    case 'deleted':
      return withSeq(
        {
          ...state,
          jobs: without(state.jobs, action.id),
          deleted: { ...state.deleted, [action.id]: true }
        },
        action
      );
    case 'cluster':
      return withSeq({ ...state, cluster: action.cluster }, action);
    case 'notebook':
      return withSeq(
        {
          ...state,
          notebooks: {
            ...(state.notebooks ?? {}),
            [action.notebook.name]: action.notebook
          }
        },
        action
      );
    case 'notebook_deleted':
      return withSeq(
        {
          ...state,
          notebooks: state.notebooks && without(state.notebooks, action.name)
        },
        action
      );
    default:
      // A message type this version does not know: newer servers may send more.
      return state;
  }
}

const ACTIVE_ORDER: Record<string, number> = {
  running: 0,
  starting: 1,
  queued: 2
};

/**
 * The job list as shown: active jobs first (running, starting, queued), then finished
 * ones; newest first within each group.
 */
export function sortedJobs(jobs: Readonly<Record<string, Job>>): Job[] {
  return Object.values(jobs).sort((a, b) => {
    const group = (job: Job) => ACTIVE_ORDER[job.state] ?? 3;
    return (
      group(a) - group(b) ||
      (b.created ?? '').localeCompare(a.created ?? '') ||
      a.id.localeCompare(b.id)
    );
  });
}

/** The queue with its jobs resolved (ids the panel does not know are kept, by id). */
export function queuedJobs(state: PanelState): Array<Job | { id: string }> {
  return (state.cluster?.queue ?? []).map(id => state.jobs[id] ?? { id });
}
