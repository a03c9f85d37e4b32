/**
 * The panel's model: the reduced state plus where the connection stands, kept current
 * from the event stream ("live") or by polling the REST API ("poll").
 */
import { Poll } from '@lumino/polling';

import { ApiError, MlclusterApi } from './api';
import { ConnectionStatus, EventStream, SocketFactory } from './events';
import { Action, PanelState, initialState, reduce } from './reducer';
import { ServerEvent } from './types';

export type RefreshMode = 'live' | 'poll';

export interface StoreOptions {
  mode: RefreshMode;
  /** Seconds between refreshes in poll mode. */
  pollInterval: number;
  createSocket?: SocketFactory;
}

export type Listener = () => void;

export class PanelStore {
  private stateValue: PanelState = initialState;
  private connectionValue: ConnectionStatus = {
    state: 'stopped',
    failures: 0,
    retryAt: null,
    lastError: null
  };
  private problemValue: ApiError | null = null;
  private notebooksErrorValue: ApiError | null = null;
  private selectedValue: string | null = null;
  private listeners = new Set<Listener>();
  private stream: EventStream | null = null;
  private poll: Poll | null = null;

  constructor(
    readonly api: MlclusterApi,
    private options: StoreOptions
  ) {}

  get state(): PanelState {
    return this.stateValue;
  }

  get connection(): ConnectionStatus {
    return this.connectionValue;
  }

  /** Why the API cannot be used at all (extension missing, server error), if known. */
  get problem(): ApiError | null {
    return this.problemValue;
  }

  /** Why the notebook servers cannot be listed (503: no cluster configured). */
  get notebooksError(): ApiError | null {
    return this.notebooksErrorValue;
  }

  /** The job whose details the panel shows (null: the list). Commands default to it. */
  get selectedJob(): string | null {
    return this.selectedValue;
  }

  select(id: string | null): void {
    if (id !== this.selectedValue) {
      this.selectedValue = id;
      this.emit();
    }
  }

  get mode(): RefreshMode {
    return this.options.mode;
  }

  subscribe(listener: Listener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  dispatch(action: Action): void {
    const next = reduce(this.stateValue, action);
    if (next !== this.stateValue) {
      this.stateValue = next;
      this.emit();
    }
  }

  start(): void {
    if (this.options.mode === 'live') {
      // Notebook servers come from their own route; the stream only brings their changes.
      void this.loadNotebooks();
      this.stream = new EventStream({
        url: () => this.api.eventsUrl(),
        createSocket: this.options.createSocket,
        onEvent: event => this.onEvent(event),
        onStatus: status => this.onStatus(status)
      });
      this.stream.start();
    } else {
      this.poll = new Poll({
        factory: () => this.refresh(),
        frequency: {
          interval: Math.max(1, this.options.pollInterval) * 1000,
          backoff: true,
          max: 60 * 1000
        },
        standby: 'when-hidden',
        name: 'jupyterlab-mlcluster:jobs'
      });
    }
  }

  stop(): void {
    this.stream?.stop();
    this.stream = null;
    this.poll?.dispose();
    this.poll = null;
  }

  /** Apply new settings: restarts the connection only when the mode or interval changed. */
  configure(options: StoreOptions): void {
    const changed =
      options.mode !== this.options.mode ||
      options.pollInterval !== this.options.pollInterval;
    this.options = options;
    if (changed && (this.stream || this.poll)) {
      this.stop();
      this.start();
    }
  }

  /** "Retry now" / "Refresh": reconnect at once, or poll at once. */
  async refreshNow(): Promise<void> {
    if (this.stream) {
      this.stream.reconnectNow();
      await this.loadNotebooks();
    } else if (this.poll) {
      await this.poll.refresh();
    } else {
      await this.refresh();
    }
  }

  /** Everything from REST, as one snapshot. Throws on failure (Poll backs off then). */
  async refresh(): Promise<void> {
    try {
      const [jobs, cluster] = await Promise.all([
        this.api.listJobs(),
        this.api.getCluster()
      ]);
      this.setProblem(null);
      this.dispatch({ type: 'snapshot', jobs, cluster });
    } catch (error) {
      this.setProblem(asApiError(error));
      this.dispatch({ type: 'disconnected' });
      throw error;
    }
    await this.loadNotebooks();
  }

  async loadNotebooks(): Promise<void> {
    try {
      const notebooks = await this.api.listNotebooks();
      this.notebooksErrorValue = null;
      this.dispatch({ type: 'notebooks_loaded', notebooks });
    } catch (error) {
      this.notebooksErrorValue = asApiError(error);
    }
    this.emit();
  }

  private onEvent(event: ServerEvent): void {
    if (event.type === 'snapshot') {
      this.setProblem(null);
      // Notebook events sent while we were away are lost: list them again.
      void this.loadNotebooks();
    }
    this.dispatch(event);
  }

  private onStatus(status: ConnectionStatus): void {
    const wasWaiting = this.connectionValue.state === 'waiting';
    this.connectionValue = status;
    if (status.state === 'waiting') {
      this.dispatch({ type: 'disconnected' });
      if (!wasWaiting) {
        void this.diagnose();
      }
    }
    this.emit();
  }

  /** The socket failed: ask a plain route why, to tell the user something useful. */
  private async diagnose(): Promise<void> {
    try {
      await this.api.getCluster();
      this.setProblem(null);
    } catch (error) {
      this.setProblem(asApiError(error));
    }
  }

  private setProblem(problem: ApiError | null): void {
    if (problem?.message !== this.problemValue?.message) {
      this.problemValue = problem;
      this.emit();
    }
  }

  private emit(): void {
    for (const listener of [...this.listeners]) {
      listener();
    }
  }
}

export function asApiError(error: unknown): ApiError {
  if (error instanceof ApiError) {
    return error;
  }
  // fetch rejects with a TypeError when the server cannot be reached at all.
  return new ApiError(
    0,
    `The Jupyter server cannot be reached (${String((error as Error)?.message ?? error)}).`
  );
}
