import { PanelStore } from '../model/store';
import { makeJob, nodeSocket, serverForTests, waitFor } from './helpers';

const cluster = {
  backend: 'local',
  capacity: { cpus: { total: 4, free: 4 } },
  queue: []
};

describe('panel store', () => {
  const { server, api } = serverForTests();
  let store: PanelStore | null = null;

  afterEach(() => {
    store?.stop();
    store = null;
    server.onSocket = () => undefined;
  });

  it('live: snapshot, events, and the notebook servers 503 as "no cluster"', async () => {
    const job = makeJob();
    server.onSocket = ws =>
      ws.send(JSON.stringify({ type: 'snapshot', jobs: [job], cluster }));
    server.json('GET', 'notebooks', 503, {
      message: 'No Kubernetes cluster is configured.'
    });
    store = new PanelStore(api, {
      mode: 'live',
      pollInterval: 5,
      createSocket: nodeSocket
    });
    let changes = 0;
    store.subscribe(() => changes++);
    store.start();
    await waitFor(() => store!.state.synced, 5000, 'snapshot');
    expect(store.state.jobs[job.id].name).toBe(job.name);
    expect(store.connection.state).toBe('open');
    await waitFor(
      () => store!.notebooksError !== null,
      5000,
      'notebooks answer'
    );
    expect(store.notebooksError?.unavailable).toBe(true);
    expect(store.problem).toBeNull();

    server.broadcast({ type: 'job', job: { ...job, state: 'succeeded' } });
    await waitFor(
      () => store!.state.jobs[job.id].state === 'succeeded',
      5000,
      'job event'
    );
    expect(changes).toBeGreaterThan(2);
  });

  it('live: a server without the extension is diagnosed, not just retried', async () => {
    // no routes and the websocket upgrade on another path: everything 404s
    store = new PanelStore(api, {
      mode: 'live',
      pollInterval: 5,
      createSocket: url =>
        nodeSocket(url.replace('/mlcluster/api/events', '/nothing'))
    });
    store.start();
    await waitFor(() => store!.problem !== null, 5000, 'diagnosis');
    expect(store.problem?.missingExtension).toBe(true);
    expect(store.connection.state).not.toBe('open');
    expect(store.state.synced).toBe(false);
  });

  it('poll: REST snapshots on an interval', async () => {
    let jobs = [makeJob()];
    server.route('GET', 'jobs', (_req, res) => {
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ jobs }));
    });
    server.json('GET', 'cluster', 200, cluster);
    server.json('GET', 'notebooks', 200, {
      notebooks: [{ name: 'nb', phase: 'Running' }]
    });
    store = new PanelStore(api, { mode: 'poll', pollInterval: 1 });
    store.start();
    await waitFor(() => store!.state.synced, 5000, 'first poll');
    expect(Object.keys(store.state.jobs)).toEqual([jobs[0].id]);
    await waitFor(() => store!.state.notebooks !== null, 5000, 'notebooks');
    expect(store.state.notebooks).toEqual({
      nb: { name: 'nb', phase: 'Running' }
    });
    jobs = [makeJob()];
    await waitFor(() => !!store!.state.jobs[jobs[0].id], 5000, 'second poll');
    expect(
      server.requests.some(r => r.url.startsWith('/mlcluster/api/events'))
    ).toBe(false);
  });

  it('selection is part of the model, so commands can act on the job on screen', () => {
    store = new PanelStore(api, { mode: 'poll', pollInterval: 5 });
    let changes = 0;
    store.subscribe(() => changes++);
    store.select('j1');
    store.select('j1');
    expect(store.selectedJob).toBe('j1');
    expect(changes).toBe(1);
  });
});
