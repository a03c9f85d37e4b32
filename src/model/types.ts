/**
 * The JSON shapes the server extension speaks, named for the sidebar. Every one is a schema
 * of the API document (jupyterlab_mlcluster/server/openapi.yaml), through the types
 * generated from it (./api-types.ts, `jlpm generate:types`): change the document, not these.
 */
import type { components } from './api-types';

type Schemas = components['schemas'];

export type Job = Schemas['Job'];
export type JobState = Job['state'];
export type JobOrigin = Job['origin'];
export type Rank = Schemas['Rank'];
export type RankState = Rank['state'];
export type RankMetrics = Schemas['RankMetrics'];
export type RankProgress = NonNullable<Rank['progress']>;
export type Cluster = Schemas['Cluster'];
export type Capacity = Schemas['Capacity'];
/** A per-user notebook server (the Notebook custom resource as the REST API shows it). */
export type NotebookServer = Schemas['Notebook'];
/** A user's session: live ranks that `%%distributed --session NAME` cells run on. */
export type Session = Schemas['Session'];
export type LogLine = Schemas['LogLine'];
export type LogsPage = Schemas['LogPage'];
/** One sample of `GET /jobs/{id}/metrics`. */
export type MetricsSample = Schemas['MetricsSample'];
export type JobMetrics = Schemas['JobMetrics'];
/** `GET /jobs/{id}/stacks`: every rank's threads' stacks, folded (issue 33). */
export type StackReport = Schemas['StackReport'];
/** `POST /jobs/{id}/tensorboard`: where the job's TensorBoard is served. */
export type TensorBoardAnswer = Schemas['TensorBoard'];
/**
 * The messages of the `/mlcluster/api/events` websocket. `seq`, when the server sends it, is
 * the store's change-feed position: a message never has a lower seq than one sent before it.
 */
export type ServerEvent = Schemas['Event'];

export const FINAL_JOB_STATES: ReadonlySet<string> = new Set<JobState>([
  'succeeded',
  'failed',
  'cancelled'
]);
