/**
 * Client of the server extension's REST API (`/mlcluster/api`, see SPEC.md).
 *
 * It talks through a `Transport` so the same code runs in JupyterLab (ServerConnection:
 * base URL, token, XSRF) and in the unit tests (plain fetch against a real local server).
 */
import { LoggedSeries } from './curves';
import { MetricsHistory, historyFromResponse } from './metrics';
import { readNdjson } from './ndjson';
import {
  Cluster,
  Job,
  LogLine,
  LogsPage,
  NotebookServer,
  Session,
  StackReport,
  TensorBoardAnswer
} from './types';

export const API_PATH = 'mlcluster/api';

export interface Transport {
  /** An HTTP request to `path` (relative to the server's base URL), authenticated. */
  request(path: string, init?: RequestInit): Promise<Response>;
  /** The websocket URL of `path`, authenticated the way the server expects. */
  websocketUrl(path: string): string;
}

/** An answer of the API that is not a success: the server's `{"message": ...}` and status. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
    this.name = 'ApiError';
  }

  /** 503: the feature needs a cluster and none is configured (notebook servers). */
  get unavailable(): boolean {
    return this.status === 503;
  }

  /** 404 on the API itself: the server extension is not installed or not enabled. */
  get missingExtension(): boolean {
    return this.status === 404 && this.message.startsWith(MISSING_EXTENSION);
  }
}

const MISSING_EXTENSION = 'The jupyterlab-mlcluster server extension';

async function errorFrom(response: Response, path: string): Promise<ApiError> {
  const text = await response.text().catch(() => '');
  let message: string | undefined;
  try {
    const body = JSON.parse(text);
    message = typeof body?.message === 'string' ? body.message : undefined;
  } catch {
    // Not JSON: Jupyter Server's own HTML error page (an unknown route) or a proxy's.
  }
  if (!message && response.status === 404) {
    message = `${MISSING_EXTENSION} is not answering at /${API_PATH}/${path} (404). Is the Python package installed and the server extension enabled?`;
  }
  return new ApiError(
    response.status,
    message ??
      `${response.status} ${response.statusText || 'error'} from /${API_PATH}/${path}`
  );
}

function query(
  params: Record<string, string | number | boolean | null | undefined>
): string {
  const parts = Object.entries(params)
    .filter(([, v]) => v !== null && v !== undefined && v !== '')
    .map(
      ([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(String(v))}`
    );
  return parts.length ? `?${parts.join('&')}` : '';
}

/** Lists may come bare or wrapped (`{"jobs": [...]}`, with paging fields beside it). */
function listFrom<T>(body: unknown, key: string): T[] {
  if (Array.isArray(body)) {
    return body as T[];
  }
  const wrapped = (body as Record<string, unknown> | null)?.[key];
  return Array.isArray(wrapped) ? (wrapped as T[]) : [];
}

export interface NotebookRequest {
  name: string;
  image?: string;
  cpu?: number;
  memory?: string;
  gpus?: number;
  workspace_size?: string;
}

/** What `POST /jobs/{id}/export` can write (the API document's enum). */
export const EXPORT_TARGETS = [
  'script',
  'sbatch',
  'trainjob',
  'pytorchjob'
] as const;
export type ExportTarget = (typeof EXPORT_TARGETS)[number];

export class MlclusterApi {
  constructor(readonly transport: Transport) {}

  private async call(path: string, init?: RequestInit): Promise<Response> {
    const response = await this.transport.request(`${API_PATH}/${path}`, init);
    if (!response.ok) {
      throw await errorFrom(response, path);
    }
    return response;
  }

  private async json<T>(path: string, init?: RequestInit): Promise<T> {
    const response = await this.call(path, init);
    const text = await response.text();
    return (text ? JSON.parse(text) : null) as T;
  }

  private send<T>(method: string, path: string, body?: unknown): Promise<T> {
    return this.json<T>(path, {
      method,
      body: body === undefined ? undefined : JSON.stringify(body),
      headers:
        body === undefined ? undefined : { 'Content-Type': 'application/json' }
    });
  }

  async listJobs(): Promise<Job[]> {
    return listFrom<Job>(await this.json('jobs'), 'jobs');
  }

  getJob(id: string): Promise<Job> {
    return this.json<Job>(`jobs/${encodeURIComponent(id)}`);
  }

  /** Ask the job to stop; it ends `cancelled` (watch the event stream for that). */
  cancelJob(id: string): Promise<Job | null> {
    return this.send('DELETE', `jobs/${encodeURIComponent(id)}`);
  }

  /** Cancel if needed and forget the job, its logs and metrics. */
  deleteJob(id: string): Promise<unknown> {
    return this.send(
      'DELETE',
      `jobs/${encodeURIComponent(id)}${query({ purge: true })}`
    );
  }

  getLogs(
    id: string,
    options: { since?: string; rank?: number | null } = {}
  ): Promise<LogsPage> {
    return this.json<LogsPage>(
      `jobs/${encodeURIComponent(id)}/logs${query({ since: options.since, rank: options.rank })}`
    );
  }

  /**
   * Follow a job's logs: NDJSON line objects streamed until the job ends, in batches as
   * they arrive. Stops early when `signal` aborts.
   */
  async *followLogs(
    id: string,
    options: { since?: string; rank?: number | null; signal?: AbortSignal } = {}
  ): AsyncGenerator<LogLine[]> {
    const path = `jobs/${encodeURIComponent(id)}/logs${query({
      since: options.since,
      rank: options.rank,
      follow: true
    })}`;
    const response = await this.call(path, { signal: options.signal });
    if (!response.body) {
      throw new ApiError(
        response.status,
        'The log stream has no body to read.'
      );
    }
    yield* readNdjson<LogLine>(response.body, options.signal);
  }

  async getMetrics(id: string): Promise<MetricsHistory> {
    return historyFromResponse(
      await this.json(`jobs/${encodeURIComponent(id)}/metrics`)
    );
  }

  /**
   * The series the job logged: `names` only (every name so far) without `series`, else
   * the points of those series stored after `after` (a `cursor` of an earlier answer).
   */
  async getLogged(
    id: string,
    series: string[] = [],
    after = 0
  ): Promise<LoggedSeries> {
    // `since` now: not the CPU/memory samples this answer also carries (the last hour's)
    const query = new URLSearchParams({
      since: String(Math.floor(Date.now() / 1000))
    });
    if (series.length) {
      query.set('series', series.join(','));
    }
    if (after) {
      query.set('after', String(after));
    }
    const answer = await this.json<{ logged?: LoggedSeries }>(
      `jobs/${encodeURIComponent(id)}/metrics?${query}`
    );
    // a server from before mlc.log answers no `logged`: nothing logged
    return (
      answer.logged ?? { names: [], series: [], cursor: after, more: false }
    );
  }

  /** Where the job's ranks are: read now while it runs, else the stacks it kept (409: none). */
  getStacks(id: string): Promise<StackReport> {
    return this.json<StackReport>(`jobs/${encodeURIComponent(id)}/stacks`);
  }

  /**
   * Start (or reuse) a TensorBoard over this job's data, and `others` beside it to compare;
   * answers its URL (a path under the server's base URL). 409: no data written yet.
   */
  openTensorBoard(
    id: string,
    others: string[] = []
  ): Promise<TensorBoardAnswer> {
    return this.send(
      'POST',
      `jobs/${encodeURIComponent(id)}/tensorboard`,
      others.length ? { jobs: others } : {}
    );
  }

  /**
   * What runs the job again outside the notebook, as one zip (`mlcluster export`): the
   * cell as a script, its pushed variables, requirements and the target's launch file.
   */
  async exportJob(
    id: string,
    target: ExportTarget,
    image?: string
  ): Promise<Blob> {
    const response = await this.call(
      `jobs/${encodeURIComponent(id)}/export${query({ as: target, image })}`,
      { method: 'POST' }
    );
    return response.blob();
  }

  getCluster(): Promise<Cluster> {
    return this.json<Cluster>('cluster');
  }

  async listNotebooks(): Promise<NotebookServer[]> {
    return listFrom<NotebookServer>(await this.json('notebooks'), 'notebooks');
  }

  spawnNotebook(request: NotebookRequest): Promise<NotebookServer> {
    return this.send('POST', 'notebooks', request);
  }

  stopNotebook(name: string): Promise<NotebookServer> {
    return this.send('POST', `notebooks/${encodeURIComponent(name)}/stop`);
  }

  startNotebook(name: string): Promise<NotebookServer> {
    return this.send('POST', `notebooks/${encodeURIComponent(name)}/start`);
  }

  deleteNotebook(name: string): Promise<unknown> {
    return this.send('DELETE', `notebooks/${encodeURIComponent(name)}`);
  }

  async listSessions(): Promise<Session[]> {
    return listFrom<Session>(await this.json('sessions'), 'sessions');
  }

  /** End a session: its ranks run their atexit handlers and exit, its slots are freed. */
  stopSession(name: string): Promise<Session> {
    return this.send('DELETE', `sessions/${encodeURIComponent(name)}`);
  }

  /** Fresh ranks for a session (its state is lost). */
  restartSession(name: string): Promise<Session> {
    return this.send('POST', `sessions/${encodeURIComponent(name)}/restart`);
  }

  eventsUrl(): string {
    return this.transport.websocketUrl(`${API_PATH}/events`);
  }
}
