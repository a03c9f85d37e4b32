/**
 * A small real HTTP + websocket server on localhost standing in for the server extension,
 * so the API client, log follower and event stream are tested over real sockets.
 */
import * as http from 'http';
import { AddressInfo } from 'net';
import { WebSocket, WebSocketServer } from 'ws';

import { MlclusterApi, Transport } from '../model/api';
import { SocketLike } from '../model/events';
import { Job, NotebookServer } from '../model/types';

export type Route = (
  req: http.IncomingMessage,
  res: http.ServerResponse,
  url: URL
) => void;

export class TestServer {
  readonly routes = new Map<string, Route>();
  readonly requests: Array<{
    method: string;
    url: string;
    headers: http.IncomingHttpHeaders;
  }> = [];
  readonly sockets = new Set<WebSocket>();
  /** Called with each new websocket on /mlcluster/api/events. */
  onSocket: (ws: WebSocket) => void = () => undefined;
  private server: http.Server | null = null;
  private wss: WebSocketServer | null = null;
  port = 0;

  get base(): string {
    return `http://127.0.0.1:${this.port}/`;
  }

  /** Answer `METHOD /mlcluster/api/<path>` (path without the query string). */
  route(method: string, path: string, route: Route): this {
    this.routes.set(`${method} /mlcluster/api/${path}`, route);
    return this;
  }

  json(method: string, path: string, status: number, body: unknown): this {
    return this.route(method, path, (_req, res) => sendJson(res, status, body));
  }

  /** Listen (on the same port as before when restarting). */
  async start(port = this.port): Promise<void> {
    const server = http.createServer((req, res) => {
      const url = new URL(req.url ?? '/', 'http://localhost');
      this.requests.push({
        method: req.method ?? 'GET',
        url: req.url ?? '',
        headers: req.headers
      });
      const route = this.routes.get(`${req.method} ${url.pathname}`);
      if (route) {
        route(req, res, url);
      } else {
        res.writeHead(404, { 'Content-Type': 'text/html' });
        res.end('<html><body>404 : Not Found</body></html>');
      }
    });
    const wss = new WebSocketServer({ noServer: true });
    server.on('upgrade', (req, socket, head) => {
      if (!req.url?.startsWith('/mlcluster/api/events')) {
        socket.destroy();
        return;
      }
      wss.handleUpgrade(req, socket, head, ws => {
        this.sockets.add(ws);
        ws.on('close', () => this.sockets.delete(ws));
        this.onSocket(ws);
      });
    });
    await new Promise<void>(resolve =>
      server.listen(port, '127.0.0.1', resolve)
    );
    this.port = (server.address() as AddressInfo).port;
    this.server = server;
    this.wss = wss;
  }

  /** Stop abruptly, as a crashing or restarting Jupyter server does. */
  async stop(): Promise<void> {
    for (const ws of this.sockets) {
      ws.terminate();
    }
    this.sockets.clear();
    this.wss?.close();
    const server = this.server;
    this.server = null;
    if (server) {
      server.closeAllConnections();
      await new Promise<void>(resolve => server.close(() => resolve()));
    }
  }

  broadcast(message: unknown): void {
    for (const ws of this.sockets) {
      ws.send(JSON.stringify(message));
    }
  }
}

export function sendJson(
  res: http.ServerResponse,
  status: number,
  body: unknown
): void {
  res.writeHead(status, { 'Content-Type': 'application/json' });
  res.end(JSON.stringify(body));
}

/** Plain fetch with the token header, as ServerConnection sends it. */
export function fetchTransport(
  base: () => string,
  token = 'secret-token'
): Transport {
  return {
    request: (path, init = {}) =>
      fetch(new URL(path, base()), {
        ...init,
        headers: {
          ...(init.headers as Record<string, string>),
          Authorization: `token ${token}`
        }
      }),
    websocketUrl: path =>
      `${new URL(path, base()).href.replace(/^http/, 'ws')}?token=${token}`
  };
}

export const nodeSocket = (url: string): SocketLike =>
  new WebSocket(url) as unknown as SocketLike;

/** Wait until `predicate` holds (polling every 10 ms), or fail after `ms`. */
export async function waitFor(
  predicate: () => boolean,
  ms = 5000,
  what = 'condition'
): Promise<void> {
  const deadline = Date.now() + ms;
  while (!predicate()) {
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${what}`);
    }
    await new Promise(resolve => setTimeout(resolve, 10));
  }
}

let counter = 0;

/** A job as the server sends it, with `overrides` applied. */
export function makeJob(overrides: Record<string, unknown> = {}): any {
  counter++;
  const workers = (overrides.workers as number) ?? 2;
  const job: Job = {
    id: `j${counter.toString(16).padStart(9, '0')}`,
    name: `job-${counter}`,
    state: 'running',
    backend: 'local',
    workers,
    gpus_per_worker: 0,
    cpus: 1,
    memory: null,
    framework: 'pytorch',
    image: null,
    queue: null,
    priority: 0,
    tensorboard: null,
    sync_packages: true,
    timeout: null,
    max_restarts: 0,
    env: {},
    created: '2026-11-22T01:00:00.000Z',
    started: '2026-11-22T01:00:01.000Z',
    finished: null,
    error: null,
    failed_rank: null,
    reason: null,
    restarts: 0,
    queue_position: null,
    owner: 'alice',
    origin: {},
    has_result: false,
    parent: null,
    sweep: null,
    session: null,
    gpu_idle_since: null,
    stall_after: null,
    on_stall: 'warn',
    stall: null,
    attempts: [],
    straggler: null,
    tracking: null,
    ranks: Array.from({ length: workers }, (_, rank) => ({
      rank,
      state: 'running',
      exit_code: null,
      pid: 1000 + rank,
      host: 'localhost',
      started: '2026-11-22T01:00:01.000Z',
      finished: null,
      metrics: {
        cpu_percent: 50,
        memory_bytes: 1000,
        gpu_util: null,
        gpu_memory_bytes: null
      },
      progress: null
    }))
  };
  return { ...job, ...overrides };
}

/** A notebook server in the REST shape (schema Notebook), with `overrides`. */
export function makeNotebook(
  overrides: Partial<NotebookServer> = {}
): NotebookServer {
  const name = overrides.name ?? 'nb';
  return {
    name,
    namespace: 'users',
    owner: 'alice',
    phase: 'ready',
    ready: true,
    stopped: false,
    url: `/notebook/users/${name}/`,
    message: '',
    created: '2026-11-22T01:00:00Z',
    last_activity: null,
    image: 'jupyter/minimal-notebook',
    cpu: '1',
    memory: '2Gi',
    gpus: 0,
    workspace_size: null,
    ...overrides
  };
}

/**
 * For a describe block: one server for all its tests (routes and request log cleared
 * before each) and an API client pointed at it.
 */
export function serverForTests(): { server: TestServer; api: MlclusterApi } {
  const server = new TestServer();
  beforeAll(() => server.start(0));
  afterAll(() => server.stop());
  beforeEach(() => {
    server.routes.clear();
    server.requests.length = 0;
  });
  return { server, api: new MlclusterApi(fetchTransport(() => server.base)) };
}
