import {
  PanelState,
  initialState,
  queuedJobs,
  reduce,
  sortedJobs
} from '../model/reducer';
import { Cluster, ServerEvent } from '../model/types';
import { makeJob, makeNotebook } from './helpers';

const cluster: Cluster = {
  backend: 'local',
  capacity: {
    cpus: { total: 8, free: 4 },
    gpus: { total: 0, free: 0 },
    memory: { total: null, free: null }
  },
  queue: []
};

function run(
  events: ServerEvent[],
  start: PanelState = initialState
): PanelState {
  return events.reduce(reduce, start);
}

describe('event stream reducer', () => {
  it('a snapshot replaces everything the panel held', () => {
    const old = makeJob();
    const a = makeJob();
    const b = makeJob({ state: 'succeeded' });
    const state = run([
      { type: 'snapshot', jobs: [old], cluster },
      { type: 'deleted', id: 'gone' },
      {
        type: 'snapshot',
        jobs: [a, b],
        cluster: { ...cluster, queue: [a.id] },
        seq: 7
      }
    ]);
    expect(Object.keys(state.jobs).sort()).toEqual([a.id, b.id].sort());
    expect(state.cluster?.queue).toEqual([a.id]);
    expect(state.synced).toBe(true);
    expect(state.seq).toBe(7);
    expect(state.deleted).toEqual({});
  });

  it('a job message adds or replaces that job only', () => {
    const a = makeJob({ state: 'queued' });
    const b = makeJob();
    const started = { ...a, state: 'running' };
    const state = run([
      { type: 'snapshot', jobs: [a, b], cluster },
      { type: 'job', job: started }
    ]);
    expect(state.jobs[a.id].state).toBe('running');
    expect(state.jobs[b.id]).toBe(b);
    const c = makeJob();
    expect(reduce(state, { type: 'job', job: c }).jobs[c.id]).toBe(c);
  });

  it('deleted removes the job, and a late update does not bring it back', () => {
    const a = makeJob();
    const state = run([
      { type: 'snapshot', jobs: [a], cluster },
      { type: 'deleted', id: a.id },
      { type: 'job', job: { ...a, state: 'cancelled' } }
    ]);
    expect(state.jobs[a.id]).toBeUndefined();
    // ...until a snapshot says otherwise (the server is the authority).
    expect(
      reduce(state, { type: 'snapshot', jobs: [a], cluster }).jobs[a.id]
    ).toBe(a);
  });

  it('a finished job does not go back to running on an out-of-order message', () => {
    const a = makeJob();
    const done = {
      ...a,
      state: 'succeeded',
      finished: '2026-11-22T01:05:00.000Z'
    };
    const state = run([
      { type: 'snapshot', jobs: [a], cluster },
      { type: 'job', job: done },
      { type: 'job', job: a }
    ]);
    expect(state.jobs[a.id].state).toBe('succeeded');
  });

  it('numbered messages older than what is applied are ignored', () => {
    const a = makeJob({ state: 'starting' });
    const running = { ...a, state: 'running' };
    const state = run([
      { type: 'snapshot', jobs: [a], cluster, seq: 10 },
      { type: 'job', job: running, seq: 9 }, // already in the snapshot
      { type: 'job', job: running, seq: 12 },
      { type: 'job', job: { ...a, state: 'starting' }, seq: 11 } // overtaken
    ]);
    expect(state.jobs[a.id].state).toBe('running');
    expect(state.seq).toBe(12);
  });

  it('cluster messages replace capacity and queue', () => {
    const state = run([
      { type: 'snapshot', jobs: [], cluster },
      { type: 'cluster', cluster: { ...cluster, queue: ['x'] } }
    ]);
    expect(state.cluster?.queue).toEqual(['x']);
    expect(queuedJobs(state)).toEqual([{ id: 'x' }]);
  });

  it('notebook messages update the loaded list; notebook_deleted removes', () => {
    let state = reduce(initialState, {
      type: 'notebooks_loaded',
      notebooks: [makeNotebook({ name: 'a', phase: 'Running' })]
    });
    state = run(
      [
        {
          type: 'notebook',
          notebook: makeNotebook({
            name: 'b',
            phase: 'Pending',
            message: 'Pulling image'
          })
        },
        {
          type: 'notebook',
          notebook: makeNotebook({ name: 'a', phase: 'Stopped' })
        },
        { type: 'notebook_deleted', name: 'b' }
      ],
      state
    );
    expect(state.notebooks).toEqual({
      a: makeNotebook({ name: 'a', phase: 'Stopped' })
    });
  });

  it('unknown messages and no-op messages keep the same state object', () => {
    const state = run([{ type: 'snapshot', jobs: [makeJob()], cluster }]);
    expect(reduce(state, { type: 'future-thing' } as any)).toBe(state);
    const disconnected = reduce(state, { type: 'disconnected' });
    expect(disconnected.synced).toBe(false);
    expect(reduce(disconnected, { type: 'disconnected' })).toBe(disconnected);
  });

  it('lists active jobs first, newest first within a group', () => {
    const oldRunning = makeJob({ created: '2026-11-22T01:00:00.000Z' });
    const newRunning = makeJob({ created: '2026-11-22T02:00:00.000Z' });
    const queued = makeJob({
      state: 'queued',
      created: '2026-11-22T03:00:00.000Z'
    });
    const failed = makeJob({
      state: 'failed',
      created: '2026-11-22T04:00:00.000Z'
    });
    const done = makeJob({
      state: 'succeeded',
      created: '2026-11-22T00:00:00.000Z'
    });
    const state = run([
      {
        type: 'snapshot',
        jobs: [done, queued, oldRunning, failed, newRunning],
        cluster
      }
    ]);
    expect(sortedJobs(state.jobs).map(j => j.id)).toEqual([
      newRunning.id,
      oldRunning.id,
      queued.id,
      failed.id,
      done.id
    ]);
  });
});
