/**
 * The live connection to `/mlcluster/api/events`: parses messages, and reconnects with
 * backoff when the server goes away (a restart), until stopped. After each reconnect the
 * server's first message is a snapshot, which replaces whatever the panel held.
 */
import { BackoffOptions, DEFAULT_BACKOFF, backoffDelay } from './backoff';
import { ServerEvent } from './types';

/** The part of the browser's WebSocket used here (the `ws` package also has it). */
export interface SocketLike {
  onopen: ((ev: any) => void) | null;
  onmessage: ((ev: { data: any }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: any) => void) | null;
  close(code?: number, reason?: string): void;
}

export type SocketFactory = (url: string) => SocketLike;

export type ConnectionState = 'connecting' | 'open' | 'waiting' | 'stopped';

export interface ConnectionStatus {
  state: ConnectionState;
  /** Failed attempts in a row (0 once a snapshot has arrived). */
  failures: number;
  /** When `waiting`: epoch ms of the next attempt. */
  retryAt: number | null;
  /** Why the last connection ended, when it ended badly. */
  lastError: string | null;
}

export interface EventStreamOptions {
  url: () => string;
  onEvent: (event: ServerEvent) => void;
  onStatus?: (status: ConnectionStatus) => void;
  createSocket?: SocketFactory;
  backoff?: BackoffOptions;
}

export function parseEvent(data: unknown): ServerEvent | null {
  if (typeof data !== 'string') {
    return null;
  }
  try {
    const event = JSON.parse(data);
    return event && typeof event.type === 'string'
      ? (event as ServerEvent)
      : null;
  } catch {
    return null;
  }
}

// The DOM typings are stricter than what is used (handlers taking the full event classes).
const browserSocket: SocketFactory = url =>
  new WebSocket(url) as unknown as SocketLike;

export class EventStream {
  private socket: SocketLike | null = null;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private statusValue: ConnectionStatus = {
    state: 'stopped',
    failures: 0,
    retryAt: null,
    lastError: null
  };

  constructor(private readonly options: EventStreamOptions) {}

  get status(): ConnectionStatus {
    return this.statusValue;
  }

  start(): void {
    if (this.statusValue.state === 'stopped') {
      this.connect();
    }
  }

  stop(): void {
    this.clearTimer();
    const socket = this.socket;
    this.socket = null;
    socket?.close(1000, 'panel closed');
    this.setStatus({ state: 'stopped', retryAt: null });
  }

  /** Skip the rest of the backoff wait (the user clicked "Retry now"). */
  reconnectNow(): void {
    if (this.statusValue.state === 'waiting') {
      this.clearTimer();
      this.connect();
    }
  }

  private connect(): void {
    this.setStatus({ state: 'connecting', retryAt: null });
    let socket: SocketLike;
    try {
      socket = (this.options.createSocket ?? browserSocket)(this.options.url());
    } catch (error) {
      this.scheduleRetry(String(error));
      return;
    }
    this.socket = socket;
    socket.onopen = () => {
      if (this.socket === socket) {
        this.setStatus({ state: 'open', lastError: null });
      }
    };
    socket.onmessage = ev => {
      if (this.socket !== socket) {
        return;
      }
      const event = parseEvent(ev.data);
      if (!event) {
        return; // not ours to understand (e.g. a keep-alive); newer servers may send more
      }
      if (event.type === 'snapshot') {
        // Only a snapshot proves the server works: a socket that opens and dies at once
        // must still back off.
        this.setStatus({ failures: 0 });
      }
      this.options.onEvent(event);
    };
    socket.onerror = () => undefined; // onclose follows with the code
    socket.onclose = ev => {
      if (this.socket !== socket) {
        return; // closed by stop() or replaced
      }
      this.socket = null;
      this.scheduleRetry(
        ev.code === 1000
          ? null
          : `connection closed (${ev.code}${ev.reason ? `: ${ev.reason}` : ''})`
      );
    };
  }

  private scheduleRetry(error: string | null): void {
    const failures = this.statusValue.failures + 1;
    const delay = backoffDelay(
      failures - 1,
      this.options.backoff ?? DEFAULT_BACKOFF
    );
    this.timer = setTimeout(() => {
      this.timer = null;
      this.connect();
    }, delay);
    this.setStatus({
      state: 'waiting',
      failures,
      retryAt: Date.now() + delay,
      lastError: error ?? this.statusValue.lastError
    });
  }

  private clearTimer(): void {
    if (this.timer !== null) {
      clearTimeout(this.timer);
      this.timer = null;
    }
  }

  private setStatus(change: Partial<ConnectionStatus>): void {
    this.statusValue = { ...this.statusValue, ...change };
    this.options.onStatus?.(this.statusValue);
  }
}
