/**
 * The JSON shapes the server extension speaks (docs/ARCHITECTURE.md, "JSON shapes").
 *
 * Only what the sidebar reads is typed; unknown extra fields are carried along untouched.
 */

export type JobState =
  'queued' | 'starting' | 'running' | 'succeeded' | 'failed' | 'cancelled';

export type RankState =
  'pending' | 'starting' | 'running' | 'succeeded' | 'failed' | 'cancelled';

export const FINAL_JOB_STATES: ReadonlySet<string> = new Set([
  'succeeded',
  'failed',
  'cancelled'
]);

export interface RankMetrics {
  cpu_percent: number | null;
  memory_bytes: number | null;
  gpu_util: number | null;
  gpu_memory_bytes: number | null;
}

export interface RankProgress {
  step: number;
  total: number | null;
  desc?: string | null;
}

export interface Rank {
  rank: number;
  state: RankState;
  exit_code: number | null;
  pid?: number | null;
  host?: string | null;
  started?: string | null;
  finished?: string | null;
  metrics?: Partial<RankMetrics> | null;
  progress?: RankProgress | null;
}

export interface JobOrigin {
  kind?: string;
  kernel_id?: string;
  notebook?: string | null;
  [key: string]: unknown;
}

export interface Job {
  id: string;
  name: string;
  state: JobState;
  backend: string;
  workers: number;
  gpus_per_worker?: number;
  cpus?: number;
  memory?: number | null;
  framework?: string;
  image?: string | null;
  queue?: string | null;
  priority?: number;
  created: string;
  started: string | null;
  finished: string | null;
  error: string | null;
  failed_rank?: number | null;
  reason?: string | null;
  restarts?: number;
  queue_position?: number | null;
  owner?: string | null;
  origin?: JobOrigin | null;
  has_result?: boolean;
  ranks: Rank[];
}

export interface Capacity {
  total: number;
  free: number;
}

export interface Cluster {
  backend: string;
  capacity: {
    gpus?: Capacity;
    cpus?: Capacity;
    memory?: Capacity;
  };
  /** Job ids waiting for resources, in the order they will be admitted. */
  queue: string[];
}

/** A per-user notebook server (the Notebook custom resource as the REST API shows it). */
export interface NotebookServer {
  name: string;
  namespace?: string;
  /** Readable phase, e.g. "Pending", "Starting", "Running", "Stopped", "Failed". */
  phase: string;
  ready?: boolean;
  stopped?: boolean;
  url?: string | null;
  image?: string | null;
  owner?: string | null;
  created?: string | null;
  /** Latest progress message (from pod events), shown while it spawns. */
  message?: string | null;
}

export interface LogLine {
  rank: number;
  ts?: string | null;
  stream?: string;
  line: string;
}

export interface LogsPage {
  lines: LogLine[];
  cursor: string;
}

/** One sample of `GET /jobs/{id}/metrics`. */
export interface MetricsSample extends Partial<RankMetrics> {
  ts: string;
  rank: number;
}

/**
 * The messages of the `/mlcluster/api/events` websocket. `seq`, when the server sends it, is
 * the store's change-feed position: a message never has a lower seq than one sent before it.
 */
export type ServerEvent =
  | { type: 'snapshot'; jobs: Job[]; cluster?: Cluster | null; seq?: number }
  | { type: 'job'; job: Job; seq?: number }
  | { type: 'deleted'; id: string; seq?: number }
  | { type: 'cluster'; cluster: Cluster; seq?: number }
  | { type: 'notebook'; notebook: NotebookServer; seq?: number }
  | { type: 'notebook_deleted'; name: string; seq?: number };
