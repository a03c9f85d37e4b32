import { ApiError } from '../model/api';
import { makeJob, sendJson, serverForTests } from './helpers';

describe('REST client over real HTTP', () => {
  const { server, api } = serverForTests();

  it('sends the token and reads jobs, bare or wrapped in a page', async () => {
    const job = makeJob();
    server.json('GET', 'jobs', 200, { jobs: [job], next: null });
    expect(await api.listJobs()).toEqual([job]);
    expect(server.requests[0].headers.authorization).toBe('token secret-token');
    server.json('GET', 'jobs', 200, [job]);
    expect(await api.listJobs()).toEqual([job]);
  });

  it('cancel is DELETE, delete adds purge=true', async () => {
    const job = makeJob();
    server.json('DELETE', `jobs/${job.id}`, 200, {
      ...job,
      state: 'cancelled'
    });
    await api.cancelJob(job.id);
    await api.deleteJob(job.id);
    expect(server.requests.map(r => `${r.method} ${r.url}`)).toEqual([
      `DELETE /mlcluster/api/jobs/${job.id}`,
      `DELETE /mlcluster/api/jobs/${job.id}?purge=true`
    ]);
  });

  it('opens a TensorBoard with a JSON body naming the jobs to compare', async () => {
    const answer = { url: '/mlcluster/tensorboard/j1-j2/', jobs: ['j1', 'j2'] };
    server.json('POST', 'jobs/j1/tensorboard', 200, answer);
    expect(await api.openTensorBoard('j1', ['j2'])).toEqual(answer);
    expect(server.requests[0].method).toBe('POST');
    expect(server.requests[0].headers['content-type']).toBe('application/json');
    server.json('POST', 'jobs/j3/tensorboard', 409, {
      message:
        'job j3 (x) has written no TensorBoard data yet to /s/j3/tensorboard'
    });
    const error: ApiError = await api.openTensorBoard('j3').catch(e => e);
    expect(error.status).toBe(409);
    expect(error.message).toMatch(/no TensorBoard data yet/);
  });

  it('errors carry the server message and status', async () => {
    server.json('GET', 'notebooks', 503, {
      message: 'No Kubernetes cluster is configured.'
    });
    const error: ApiError = await api.listNotebooks().then(
      () => {
        throw new Error('expected a failure');
      },
      e => e
    );
    expect(error).toBeInstanceOf(ApiError);
    expect(error.status).toBe(503);
    expect(error.unavailable).toBe(true);
    expect(error.message).toBe('No Kubernetes cluster is configured.');
  });

  it('a 404 HTML page means the server extension is missing', async () => {
    const error: ApiError = await api.getCluster().catch(e => e);
    expect(error.status).toBe(404);
    expect(error.missingExtension).toBe(true);
    expect(error.message).toMatch(
      /server extension is not answering at \/mlcluster\/api\/cluster/
    );
    // ...but a JSON 404 is the API's own answer (an unknown job)
    server.json('GET', 'jobs/nope', 404, { message: 'no job nope' });
    const unknown: ApiError = await api.getJob('nope').catch(e => e);
    expect(unknown.message).toBe('no job nope');
    expect(unknown.missingExtension).toBe(false);
  });

  it('posts JSON bodies for notebook servers', async () => {
    let body = '';
    server.route('POST', 'notebooks', (req, res) => {
      req.on('data', c => (body += c));
      req.on('end', () =>
        sendJson(res, 201, { name: 'nb1', phase: 'Pending' })
      );
    });
    server.json('POST', 'notebooks/nb1/stop', 200, {
      name: 'nb1',
      phase: 'Stopped'
    });
    expect(await api.spawnNotebook({ name: 'nb1', image: 'img:1' })).toEqual({
      name: 'nb1',
      phase: 'Pending'
    });
    expect(JSON.parse(body)).toEqual({ name: 'nb1', image: 'img:1' });
    expect(server.requests[0].headers['content-type']).toBe('application/json');
    expect((await api.stopNotebook('nb1')).phase).toBe('Stopped');
  });

  it('streams logs as NDJSON batches while the server writes them', async () => {
    let finish: () => void = () => undefined;
    server.route('GET', 'jobs/j1/logs', (_req, res, url) => {
      expect(url.searchParams.get('follow')).toBe('true');
      expect(url.searchParams.get('since')).toBe('0:10,1:0');
      res.writeHead(200, { 'Content-Type': 'application/x-ndjson' });
      res.write('{"rank":0,"line":"epoch 1"}\n{"rank":1,"li');
      finish = () => res.end('ne":"epoch 1"}\n');
    });
    const seen: string[] = [];
    for await (const batch of api.followLogs('j1', { since: '0:10,1:0' })) {
      seen.push(...batch.map(l => `${l.rank}:${l.line}`));
      finish();
    }
    expect(seen).toEqual(['0:epoch 1', '1:epoch 1']);
  });

  it('aborting a follow closes the connection', async () => {
    let closed = false;
    server.route('GET', 'jobs/j2/logs', (req, res) => {
      res.writeHead(200, { 'Content-Type': 'application/x-ndjson' });
      res.write('{"rank":0,"line":"x"}\n');
      req.socket.on('close', () => (closed = true));
    });
    const controller = new AbortController();
    const lines = [];
    for await (const batch of api.followLogs('j2', {
      signal: controller.signal
    })) {
      lines.push(...batch);
      controller.abort();
    }
    expect(lines).toHaveLength(1);
    const deadline = Date.now() + 2000;
    while (!closed && Date.now() < deadline) {
      await new Promise(r => setTimeout(r, 10));
    }
    expect(closed).toBe(true);
  });

  it('reads the metrics history into per-rank series', async () => {
    server.json('GET', 'jobs/j3/metrics', 200, {
      ranks: {
        '0': [
          { ts: 1, cpu_percent: 5 },
          { ts: 2, cpu_percent: 7 }
        ]
      }
    });
    const history = await api.getMetrics('j3');
    expect(history[0].values.cpu_percent).toEqual([5, 7]);
  });

  it('builds the events websocket URL from the transport', () => {
    expect(api.eventsUrl()).toBe(
      `ws://127.0.0.1:${server.port}/mlcluster/api/events?token=secret-token`
    );
  });
});
