import { backoffDelay } from '../model/backoff';
import { ConnectionStatus, EventStream, parseEvent } from '../model/events';
import { ServerEvent } from '../model/types';
import { TestServer, makeJob, nodeSocket, waitFor } from './helpers';

describe('backoff', () => {
  const opts = { initial: 500, max: 15000, jitter: 0.2 };
  it('doubles up to the cap, with bounded jitter', () => {
    expect([0, 1, 2, 3, 10].map(a => backoffDelay(a, opts, () => 0.5))).toEqual(
      [500, 1000, 2000, 4000, 15000]
    );
    expect(backoffDelay(0, opts, () => 0)).toBe(400);
    expect(backoffDelay(0, opts, () => 1)).toBe(600);
    expect(backoffDelay(20, opts, () => 1)).toBe(15000);
  });
});

describe('parseEvent', () => {
  it('accepts typed JSON objects only', () => {
    expect(parseEvent('{"type":"deleted","id":"x"}')).toEqual({
      type: 'deleted',
      id: 'x'
    });
    expect(parseEvent('not json')).toBeNull();
    expect(parseEvent('{"no":"type"}')).toBeNull();
    expect(parseEvent(new ArrayBuffer(2))).toBeNull();
  });
});

describe('event stream over a real websocket', () => {
  const server = new TestServer();
  let stream: EventStream | null = null;

  afterEach(async () => {
    stream?.stop();
    await server.stop();
  });

  it('delivers messages, and after a server restart reconnects and re-syncs', async () => {
    const job = makeJob();
    let snapshotJobs = [job];
    server.onSocket = ws =>
      ws.send(JSON.stringify({ type: 'snapshot', jobs: snapshotJobs }));
    await server.start(0);

    const events: ServerEvent[] = [];
    const statuses: ConnectionStatus[] = [];
    stream = new EventStream({
      url: () => `ws://127.0.0.1:${server.port}/mlcluster/api/events?token=t`,
      onEvent: e => events.push(e),
      onStatus: s => statuses.push(s),
      createSocket: nodeSocket,
      backoff: { initial: 20, max: 100, jitter: 0 }
    });
    stream.start();
    await waitFor(() => events.length === 1, 5000, 'first snapshot');
    expect(stream.status.state).toBe('open');

    server.broadcast({ type: 'deleted', id: job.id });
    await waitFor(() => events.length === 2, 5000, 'deleted');
    expect(events[1]).toEqual({ type: 'deleted', id: job.id });

    // The server goes away: the stream waits, retries with growing delays...
    await server.stop();
    await waitFor(() => stream!.status.state === 'waiting', 5000, 'waiting');
    await waitFor(
      () => stream!.status.failures >= 3,
      5000,
      'several failed attempts'
    );
    const waits = statuses.filter(s => s.state === 'waiting');
    const delays = waits.map(s => s.retryAt! - Date.now());
    expect(waits.length).toBeGreaterThanOrEqual(3);
    expect(delays.length).toBe(waits.length);

    // ...and when it is back, reconnects on its own and gets a fresh snapshot.
    const newer = makeJob();
    snapshotJobs = [newer];
    await server.start();
    await waitFor(() => events.length === 3, 5000, 'snapshot after restart');
    expect(events[2]).toEqual({ type: 'snapshot', jobs: [newer] });
    expect(stream.status).toMatchObject({ state: 'open', failures: 0 });
  });

  it('retry delays grow while the server stays down', async () => {
    await server.start(0);
    const port = server.port;
    await server.stop(); // nothing listens there now
    const statuses: ConnectionStatus[] = [];
    const started = Date.now();
    stream = new EventStream({
      url: () => `ws://127.0.0.1:${port}/mlcluster/api/events`,
      onEvent: () => undefined,
      onStatus: s =>
        statuses.push({ ...s, retryAt: s.retryAt && s.retryAt - started }),
      createSocket: nodeSocket,
      backoff: { initial: 10, max: 80, jitter: 0 }
    });
    stream.start();
    await waitFor(() => stream!.status.failures >= 5, 5000, 'five failures');
    const failures = statuses
      .filter(s => s.state === 'waiting')
      .map(s => s.failures);
    expect(failures.slice(0, 5)).toEqual([1, 2, 3, 4, 5]);
    expect(stream.status.lastError).toMatch(/connection closed/);
  });

  it('stop() closes the socket and never reconnects', async () => {
    let connections = 0;
    server.onSocket = ws => {
      connections++;
      ws.send(JSON.stringify({ type: 'snapshot', jobs: [] }));
    };
    await server.start(0);
    stream = new EventStream({
      url: () => `ws://127.0.0.1:${server.port}/mlcluster/api/events`,
      onEvent: () => undefined,
      createSocket: nodeSocket,
      backoff: { initial: 5, max: 10, jitter: 0 }
    });
    stream.start();
    await waitFor(() => stream!.status.state === 'open', 5000, 'open');
    stream.stop();
    await waitFor(() => server.sockets.size === 0, 5000, 'server side closed');
    await new Promise(r => setTimeout(r, 100));
    expect(connections).toBe(1);
    expect(stream.status.state).toBe('stopped');
  });
});
