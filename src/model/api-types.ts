/**
 * Generated from jupyterlab_mlcluster/server/openapi.yaml by scripts/api-types.mjs
 * (openapi-typescript): do not edit; run `jlpm generate:types` after changing the document.
 */

export interface paths {
  '/jobs': {
    parameters: {
      query?: never;
      header?: never;
      path?: never;
      cookie?: never;
    };
    /** Jobs, newest first */
    get: operations['listJobs'];
    put?: never;
    /** Submit a job */
    post: operations['submitJob'];
    delete?: never;
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
  '/jobs/{id}': {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description A job id, or a job name (then the newest job of that name). */
        id: components['parameters']['JobRef'];
      };
      cookie?: never;
    };
    get: operations['getJob'];
    put?: never;
    post?: never;
    /** Cancel a job (all ranks); with purge, also forget it and its logs */
    delete: operations['cancelJob'];
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
  '/jobs/{id}/logs': {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description A job id, or a job name (then the newest job of that name). */
        id: components['parameters']['JobRef'];
      };
      cookie?: never;
    };
    /** Log lines of all ranks (merged by time) or one rank */
    get: operations['getJobLogs'];
    put?: never;
    post?: never;
    delete?: never;
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
  '/jobs/{id}/metrics': {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description A job id, or a job name (then the newest job of that name). */
        id: components['parameters']['JobRef'];
      };
      cookie?: never;
    };
    /** Per-rank CPU/memory/GPU series (the last hour) and current values */
    get: operations['getJobMetrics'];
    put?: never;
    post?: never;
    delete?: never;
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
  '/jobs/{id}/tensorboard': {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description A job id, or a job name (then the newest job of that name). */
        id: components['parameters']['JobRef'];
      };
      cookie?: never;
    };
    get?: never;
    put?: never;
    /**
     * Start (or reuse) a TensorBoard over the job's $MLCLUSTER_TENSORBOARD_DIR and answer its URL
     * @description The TensorBoard runs next to the Jupyter server, bound to 127.0.0.1, and is reached only through the answered `url` (a path under the server's base URL, proxied with the server's authentication). `jobs` adds more jobs to compare in the same TensorBoard (one run per job, named by its id); the same set of jobs reuses the same TensorBoard. It stops after MLClusterApp.tensorboard_idle_timeout seconds unused. The body may be empty.
     */
    post: operations['openJobTensorBoard'];
    delete?: never;
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
  '/jobs/{id}/result': {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description A job id, or a job name (then the newest job of that name). */
        id: components['parameters']['JobRef'];
      };
      cookie?: never;
    };
    /** The result of a succeeded job, if it has a JSON form */
    get: operations['getJobResult'];
    put?: never;
    post?: never;
    delete?: never;
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
  '/cluster': {
    parameters: {
      query?: never;
      header?: never;
      path?: never;
      cookie?: never;
    };
    /** Backend, capacity (GPUs/CPUs/memory total and free) and queue */
    get: operations['getCluster'];
    put?: never;
    post?: never;
    delete?: never;
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
  '/events': {
    parameters: {
      query?: never;
      header?: never;
      path?: never;
      cookie?: never;
    };
    /**
     * Websocket: a snapshot, then job, cluster and notebook changes as they happen
     * @description Each text frame is one JSON Event (see components.schemas.Event). Job events are coalesced to at most 10 per second per job. Notebook events go only to the notebook server's owner (the caller's identity, as for /notebooks); the snapshot has none: list them with GET /notebooks.
     */
    get: operations['events'];
    put?: never;
    post?: never;
    delete?: never;
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
  '/openapi.json': {
    parameters: {
      query?: never;
      header?: never;
      path?: never;
      cookie?: never;
    };
    /** This document */
    get: operations['openapi'];
    put?: never;
    post?: never;
    delete?: never;
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
  '/notebooks': {
    parameters: {
      query?: never;
      header?: never;
      path?: never;
      cookie?: never;
    };
    /** The calling user's notebook servers */
    get: operations['listNotebooks'];
    put?: never;
    /**
     * Spawn a notebook server owned by the calling user
     * @description Returns at once; the notebook-controller then makes its pod, service and routes, and /events reports its progress (phase starting, then ready; `message` follows its pod's events).
     */
    post: operations['createNotebook'];
    delete?: never;
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
  '/notebooks/{name}': {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description The notebook server's name. */
        name: components['parameters']['NotebookName'];
      };
      cookie?: never;
    };
    get: operations['getNotebook'];
    put?: never;
    post?: never;
    /** Delete a notebook server, with everything the controller made for it (its workspace volume too) */
    delete: operations['deleteNotebook'];
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
  '/notebooks/{name}/stop': {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description The notebook server's name. */
        name: components['parameters']['NotebookName'];
      };
      cookie?: never;
    };
    get?: never;
    put?: never;
    /** Stop a notebook server (its pod goes; its workspace volume stays) */
    post: operations['stopNotebook'];
    delete?: never;
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
  '/notebooks/{name}/start': {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description The notebook server's name. */
        name: components['parameters']['NotebookName'];
      };
      cookie?: never;
    };
    get?: never;
    put?: never;
    post: operations['startNotebook'];
    delete?: never;
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
  '/sweeps': {
    parameters: {
      query?: never;
      header?: never;
      path?: never;
      cookie?: never;
    };
    /** Sweeps (%%distributed --sweep, mlcluster run --sweep), newest first, each with its trials */
    get: operations['listSweeps'];
    put?: never;
    post?: never;
    delete?: never;
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
  '/sweeps/{id}': {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description A sweep's id. */
        id: components['parameters']['SweepId'];
      };
      cookie?: never;
    };
    /** A sweep and its trials (each an ordinary job, GET /jobs/{id}) */
    get: operations['getSweep'];
    put?: never;
    post?: never;
    delete?: never;
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
  '/schedules': {
    parameters: {
      query?: never;
      header?: never;
      path?: never;
      cookie?: never;
    };
    /** Scheduled trainings (mlcluster schedule add, %%distributed --schedule) */
    get: operations['listSchedules'];
    put?: never;
    post?: never;
    delete?: never;
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
  '/schedules/{name}': {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description A schedule's name. */
        name: components['parameters']['ScheduleName'];
      };
      cookie?: never;
    };
    get: operations['getSchedule'];
    put?: never;
    post?: never;
    /** Forget a schedule; no tick is claimed after this returns (its runs' jobs stay) */
    delete: operations['deleteSchedule'];
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
  '/schedules/{name}/pause': {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description A schedule's name. */
        name: components['parameters']['ScheduleName'];
      };
      cookie?: never;
    };
    get?: never;
    put?: never;
    /** Stop firing (a run in progress goes on) */
    post: operations['pauseSchedule'];
    delete?: never;
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
  '/schedules/{name}/resume': {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description A schedule's name. */
        name: components['parameters']['ScheduleName'];
      };
      cookie?: never;
    };
    get?: never;
    put?: never;
    /** Fire again from the next tick (ticks missed while paused are not run) */
    post: operations['resumeSchedule'];
    delete?: never;
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
  '/schedules/{name}/runs': {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description A schedule's name. */
        name: components['parameters']['ScheduleName'];
      };
      cookie?: never;
    };
    /** The schedule's claimed ticks, newest first (submitted, skipped by Forbid, missed) */
    get: operations['listScheduleRuns'];
    put?: never;
    post?: never;
    delete?: never;
    options?: never;
    head?: never;
    patch?: never;
    trace?: never;
  };
}
export type webhooks = Record<string, never>;
export interface components {
  schemas: {
    Trial: {
      trial: number;
      /** @description The swept names and this trial's values (non-JSON values as their repr) */
      params: Record<string, never>;
      job_id: string;
      /** @enum {unknown} */
      state:
        | 'queued'
        | 'starting'
        | 'running'
        | 'succeeded'
        | 'failed'
        | 'cancelled';
      /** @description The named --metric of rank 0's value (or the value itself), when a number */
      metric: number | null;
      error: string | null;
      duration: number | null;
    };
    Sweep: {
      id: string;
      name: string;
      owner: string | null;
      /** Format: date-time */
      created: string;
      /** @enum {unknown} */
      state: 'queued' | 'running' | 'succeeded' | 'failed' | 'cancelled';
      /** @description Each swept name and what it sweeps ("0.1,0.01", "loguniform(0.0001,0.1)") */
      params: {
        [key: string]: string;
      };
      trials: components['schemas']['Trial'][];
      parallel: number | null;
      metric: string | null;
      /** @enum {unknown} */
      mode: 'min' | 'max';
      seed: number | null;
      /** @description The index of the best succeeded trial, if any has a numeric metric */
      best: number | null;
    };
    SweepList: {
      sweeps: components['schemas']['Sweep'][];
    };
    ScheduleRun: {
      /**
       * Format: date-time
       * @description The cron tick this run belongs to
       */
      tick: string;
      /**
       * Format: date-time
       * @description When a scheduler claimed the tick
       */
      fired: string;
      job_id: string | null;
      /** @description submitted, skipped (Forbid), missed (starting deadline), failed to submit, deleted (history limit) */
      outcome: string;
      /** @description The run's job state */
      state: string | null;
    };
    ScheduleRunList: {
      runs: components['schemas']['ScheduleRun'][];
    };
    Schedule: {
      name: string;
      owner: string | null;
      cron: string;
      timezone: string;
      /** @enum {unknown} */
      concurrency: 'Allow' | 'Forbid' | 'Replace';
      starting_deadline: number | null;
      successful_history: number;
      failed_history: number;
      suspended: boolean;
      /** @enum {unknown} */
      backend: 'local' | 'kubernetes';
      workers: number;
      /** Format: date-time */
      created: string;
      /**
       * Format: date-time
       * @description The next tick; null while paused
       */
      next_run: string | null;
      last_run:
        | null
        | (components['schemas']['ScheduleRun'] & {
            job_name?: string;
          });
    };
    ScheduleList: {
      schedules: components['schemas']['Schedule'][];
    };
    Error: {
      message: string;
    };
    /** @description The %%distributed options in snake_case, plus the code every rank runs. */
    JobSubmission: {
      /** @description Python source run as __main__ on every rank. */
      code: string;
      workers?: number;
      gpus_per_worker?: number;
      cpus?: number;
      /** @description Memory per rank: bytes, or a size like '4Gi', '512Mi', '2GB'. */
      memory?: number | string;
      /** @enum {unknown} */
      framework?: 'pytorch' | 'tensorflow' | 'jax' | 'none';
      /** @enum {unknown} */
      backend?: 'local' | 'kubernetes';
      image?: string;
      name?: string;
      env?: {
        [key: string]: string;
      };
      /** @description Fail the job after this long: seconds, or a duration like '30m', '1h30m'. */
      timeout?: number | string;
      max_restarts?: number;
      queue?: string;
      priority?: number;
      /** @description The ranks' $MLCLUSTER_TENSORBOARD_DIR: an absolute path or a URI such as 's3://bucket/runs/{job}' ({job} is the job id). Default: the server's MLClusterConfig.tensorboard_dir. */
      tensorboard?: string;
      /** @description Default true. Kubernetes, when the job runs the notebook pod's own image: install in each job pod, before the code runs, the packages installed in the notebook's environment since its pod started (false: --no-sync-packages). */
      sync_packages?: boolean;
      /** @description Variables of rank 0 to keep as the job's result (see /jobs/{id}/result). */
      pull?: string[];
    };
    Rank: {
      rank: number;
      /** @enum {unknown} */
      state:
        | 'pending'
        | 'starting'
        | 'running'
        | 'succeeded'
        | 'failed'
        | 'cancelled';
      exit_code: number | null;
      pid: number | null;
      host: string | null;
      /** Format: date-time */
      started: string | null;
      /** Format: date-time */
      finished: string | null;
      metrics: components['schemas']['RankMetrics'];
      progress: {
        step?: number | null;
        total?: number | null;
        desc?: string | null;
      } | null;
    };
    RankMetrics: {
      cpu_percent: number | null;
      memory_bytes: number | null;
      gpu_util: number | null;
      gpu_memory_bytes: number | null;
    };
    Job: {
      id: string;
      name: string;
      /** @enum {unknown} */
      state:
        | 'queued'
        | 'starting'
        | 'running'
        | 'succeeded'
        | 'failed'
        | 'cancelled';
      /** @enum {unknown} */
      backend: 'local' | 'kubernetes';
      workers: number;
      gpus_per_worker: number;
      cpus: number;
      memory: number | null;
      /** @enum {unknown} */
      framework: 'pytorch' | 'tensorflow' | 'jax' | 'none';
      image: string | null;
      queue: string | null;
      priority: number;
      /** @description The job's TensorBoard directory when --tensorboard or the setting named one. */
      tensorboard: string | null;
      /** @description Whether the job's pods install the packages the notebook added since its pod started (Kubernetes). */
      sync_packages: boolean;
      timeout: number | null;
      max_restarts: number;
      env: {
        [key: string]: string;
      };
      /** Format: date-time */
      created: string;
      /** Format: date-time */
      started: string | null;
      /** Format: date-time */
      finished: string | null;
      error: string | null;
      failed_rank: number | null;
      reason: string | null;
      restarts: number;
      queue_position: number | null;
      owner: string | null;
      /** @description Where the job was submitted from; more keys may follow the kind. */
      origin: {
        /** @description kernel, ipython, cli, python or rest */
        kind?: string;
        kernel_id?: string;
        /** @description The kernel's notebook (an absolute path), when it has one. */
        notebook?: string;
        user?: string;
        server?: string;
        command?: string;
      } & {
        [key: string]: unknown;
      };
      has_result: boolean;
      /** @description A sweep's trial names its sweep (GET /sweeps/{id}); null for other jobs */
      sweep: null | {
        id: string;
        trial: number;
        parallel?: number | null;
      };
      /**
       * Format: date-time
       * @description Set while the job runs and every GPU its ranks report on has stayed under MLClusterConfig.idle_gpu_percent utilisation (5) since this time, for at least MLClusterConfig.idle_gpu_after seconds (600); null otherwise.
       */
      gpu_idle_since: string | null;
      ranks: components['schemas']['Rank'][];
    };
    JobList: {
      jobs: components['schemas']['Job'][];
      /** @description Jobs matching the filters. */
      total: number;
      limit: number;
      offset: number;
    };
    LogLine: {
      rank: number;
      /** Format: date-time */
      ts: string;
      /** @enum {unknown} */
      stream: 'stdout' | 'stderr' | 'system';
      line: string;
      /** @description On the last line of each streamed batch (follow=true): pass as `since` to resume after it. */
      cursor?: string;
    };
    LogPage: {
      lines: components['schemas']['LogLine'][];
      /** @description Per-rank byte offsets; pass as `since` to continue after these lines. */
      cursor: string;
    };
    MetricsSample: {
      /** @description Epoch seconds. */
      ts: number;
      cpu_percent: number | null;
      memory_bytes: number | null;
      gpu_util: number | null;
      gpu_memory_bytes: number | null;
    };
    TensorBoardRequest: {
      /** @description More jobs (ids or names) to show beside the one in the path. */
      jobs?: string[];
    };
    TensorBoard: {
      /** @description Path of the TensorBoard under the server's base URL (ends with '/'). */
      url: string;
      /** @description Ids of the jobs it shows (one run each). */
      jobs: string[];
    };
    JobMetrics: {
      id: string;
      ranks: {
        rank: number;
        current: components['schemas']['RankMetrics'];
        series: components['schemas']['MetricsSample'][];
      }[];
    };
    JobResult: {
      /**
       * @description value: rank 0's last expression; pull: {name: value} of the pulled variables; none: the job produced no result.
       * @enum {unknown}
       */
      kind: 'value' | 'pull' | 'none';
      value: unknown;
    };
    /** @description One resource's total and free amount (null when the backend cannot tell). */
    Capacity: {
      total: number | null;
      free: number | null;
    };
    Cluster: {
      /** @enum {unknown} */
      backend: 'local' | 'kubernetes';
      capacity: {
        gpus: components['schemas']['Capacity'];
        cpus: components['schemas']['Capacity'];
        memory: components['schemas']['Capacity'];
      };
      /** @description Queued job ids in admission order. */
      queue: string[];
      running?: string[];
    };
    /** @description A notebook server to spawn for the calling user. Resources are requests of its pod (memory and GPUs also its limits); unset ones are left to the cluster's defaults. */
    NotebookRequest: {
      name: string;
      /** @description Container image running JupyterLab (default: the server's MLClusterApp.notebook_image, else the controller's). */
      image?: string;
      /** @description CPUs: a number (0.5) or a Kubernetes quantity ('500m'). */
      cpu?: number | string;
      /** @description Memory, a Kubernetes quantity such as '4Gi'. */
      memory?: string;
      gpus?: number;
      /** @description Size of a persistent workspace volume, e.g. '10Gi' (none if absent); it is kept while the server is stopped. */
      workspace_size?: string;
    };
    /** @description A notebook server as its owner sees it. */
    Notebook: {
      name: string;
      namespace: string;
      owner: string | null;
      /** @description starting, ready, stopped, deleting or 'error: <why>'. */
      phase: string;
      ready: boolean;
      stopped: boolean;
      /** @description /notebook/<namespace>/<name>/ */
      url: string;
      /** @description What is happening: while it spawns, the latest event of its pod (scheduling, image pull, ...); otherwise the controller's status message. */
      message: string;
      /** Format: date-time */
      created: string | null;
      /**
       * Format: date-time
       * @description As culling last saw it.
       */
      last_activity: string | null;
      image: string | null;
      cpu: string | null;
      memory: string | null;
      gpus: number;
      workspace_size: string | null;
    };
    NotebookList: {
      notebooks: components['schemas']['Notebook'][];
    };
    /** @description The store's change-feed position when the message was made. */
    Seq: number;
    /** @description One websocket message of /events (a JSON text frame). Every message also carries `seq`, an integer that grows with the time the message was made: a client may drop a message whose seq is below one it already applied (e.g. below the snapshot's). */
    Event:
      | {
          /** @constant */
          type: 'snapshot';
          seq?: components['schemas']['Seq'];
          jobs: components['schemas']['Job'][];
          total?: number;
          cluster: components['schemas']['Cluster'];
        }
      | {
          /** @constant */
          type: 'job';
          seq?: components['schemas']['Seq'];
          job: components['schemas']['Job'];
        }
      | {
          /** @enum {unknown} */
          type: 'deleted' | 'logs';
          seq?: components['schemas']['Seq'];
          id: string;
        }
      | {
          /** @constant */
          type: 'cluster';
          seq?: components['schemas']['Seq'];
          cluster: components['schemas']['Cluster'];
        }
      | {
          /** @constant */
          type: 'notebook';
          seq?: components['schemas']['Seq'];
          notebook: components['schemas']['Notebook'];
        }
      | {
          /** @constant */
          type: 'notebook_deleted';
          seq?: components['schemas']['Seq'];
          name: string;
        };
  };
  responses: {
    /** @description Not authenticated, or not authorized for this resource, or (when the server trusts an identity header) the request has no identity header */
    Forbidden: {
      headers: {
        [name: string]: unknown;
      };
      content: {
        'application/json': components['schemas']['Error'];
      };
    };
    /** @description No such job (or not a valid job id; or, when the server trusts an identity header, another user's job, exactly as a missing one), or a cross-origin request the server blocks (Jupyter Server answers those 404) */
    UnknownJob: {
      headers: {
        [name: string]: unknown;
      };
      content: {
        'application/json': components['schemas']['Error'];
      };
    };
    /** @description No such resource, or a cross-origin request the server blocks (Jupyter Server answers those 404) */
    NotFound: {
      headers: {
        [name: string]: unknown;
      };
      content: {
        'application/json': components['schemas']['Error'];
      };
    };
    /** @description No Kubernetes cluster is configured for this server, or it cannot be reached */
    NoCluster: {
      headers: {
        [name: string]: unknown;
      };
      content: {
        'application/json': components['schemas']['Error'];
      };
    };
    /** @description The Kubernetes API refused the request (e.g. missing RBAC permissions) */
    ApiRefused: {
      headers: {
        [name: string]: unknown;
      };
      content: {
        'application/json': components['schemas']['Error'];
      };
    };
    /** @description Not authenticated or authorized, or (when the server trusts an identity header) the request has no identity */
    NotebookForbidden: {
      headers: {
        [name: string]: unknown;
      };
      content: {
        'application/json': components['schemas']['Error'];
      };
    };
    /** @description Not a valid notebook name */
    BadNotebookName: {
      headers: {
        [name: string]: unknown;
      };
      content: {
        'application/json': components['schemas']['Error'];
      };
    };
    /** @description The user has no notebook server of that name (another user's counts as none), or a cross-origin request the server blocks */
    UnknownNotebook: {
      headers: {
        [name: string]: unknown;
      };
      content: {
        'application/json': components['schemas']['Error'];
      };
    };
    /** @description Invalid query parameter */
    BadQuery: {
      headers: {
        [name: string]: unknown;
      };
      content: {
        'application/json': components['schemas']['Error'];
      };
    };
    /** @description No such sweep (or another user's) */
    UnknownSweep: {
      headers: {
        [name: string]: unknown;
      };
      content: {
        'application/json': components['schemas']['Error'];
      };
    };
    /** @description No such schedule (or another user's) */
    UnknownSchedule: {
      headers: {
        [name: string]: unknown;
      };
      content: {
        'application/json': components['schemas']['Error'];
      };
    };
  };
  parameters: {
    /** @description A job id, or a job name (then the newest job of that name). */
    JobRef: string;
    /** @description The notebook server's name. */
    NotebookName: string;
    /** @description A sweep's id. */
    SweepId: string;
    /** @description A schedule's name. */
    ScheduleName: string;
  };
  requestBodies: never;
  headers: never;
  pathItems: never;
}
export type $defs = Record<string, never>;
export interface operations {
  listJobs: {
    parameters: {
      query?: {
        /** @description Only jobs in these states (repeat the parameter, or a comma list). */
        state?: (
          | 'queued'
          | 'starting'
          | 'running'
          | 'succeeded'
          | 'failed'
          | 'cancelled'
        )[];
        backend?: 'local' | 'kubernetes';
        limit?: number;
        offset?: number;
      };
      header?: never;
      path?: never;
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description A page of jobs */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['JobList'];
        };
      };
      400: components['responses']['BadQuery'];
      403: components['responses']['Forbidden'];
      404: components['responses']['NotFound'];
    };
  };
  submitJob: {
    parameters: {
      query?: never;
      header?: never;
      path?: never;
      cookie?: never;
    };
    requestBody: {
      content: {
        'application/json': components['schemas']['JobSubmission'];
      };
    };
    responses: {
      /** @description The job, as stored (usually `queued`) */
      201: {
        headers: {
          /** @description The job's URL */
          Location?: string;
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Job'];
        };
      };
      /** @description Invalid options or body */
      400: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Error'];
        };
      };
      403: components['responses']['Forbidden'];
      404: components['responses']['NotFound'];
      /** @description Valid, but the backend can never run it (e.g. more GPUs than it has) */
      409: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Error'];
        };
      };
      503: components['responses']['NoCluster'];
    };
  };
  getJob: {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description A job id, or a job name (then the newest job of that name). */
        id: components['parameters']['JobRef'];
      };
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description The job */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Job'];
        };
      };
      403: components['responses']['Forbidden'];
      404: components['responses']['UnknownJob'];
    };
  };
  cancelJob: {
    parameters: {
      query?: {
        purge?: boolean;
      };
      header?: never;
      path: {
        /** @description A job id, or a job name (then the newest job of that name). */
        id: components['parameters']['JobRef'];
      };
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description The job after cancelling (a final state) */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Job'];
        };
      };
      /** @description Cancelled and forgotten (purge=true) */
      204: {
        headers: {
          [name: string]: unknown;
        };
        content?: never;
      };
      400: components['responses']['BadQuery'];
      403: components['responses']['Forbidden'];
      404: components['responses']['UnknownJob'];
    };
  };
  getJobLogs: {
    parameters: {
      query?: {
        rank?: number;
        /** @description A `cursor` from a previous page: only lines after it. */
        since?: string;
        /** @description Only the last N lines of each rank (when `since` is not given). */
        tail?: number;
        /** @description Stream newline-delimited JSON LogLine objects until the job ends. */
        follow?: boolean;
      };
      header?: never;
      path: {
        /** @description A job id, or a job name (then the newest job of that name). */
        id: components['parameters']['JobRef'];
      };
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description A page of lines (or, with follow=true, a stream of lines) */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['LogPage'];
          'application/x-ndjson': components['schemas']['LogLine'];
        };
      };
      /** @description Invalid query parameter (e.g. a rank the job does not have) */
      400: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Error'];
        };
      };
      403: components['responses']['Forbidden'];
      404: components['responses']['UnknownJob'];
    };
  };
  getJobMetrics: {
    parameters: {
      query?: {
        /** @description Epoch seconds: only samples after it. */
        since?: number;
      };
      header?: never;
      path: {
        /** @description A job id, or a job name (then the newest job of that name). */
        id: components['parameters']['JobRef'];
      };
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description Metrics of every rank */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['JobMetrics'];
        };
      };
      400: components['responses']['BadQuery'];
      403: components['responses']['Forbidden'];
      404: components['responses']['UnknownJob'];
    };
  };
  openJobTensorBoard: {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description A job id, or a job name (then the newest job of that name). */
        id: components['parameters']['JobRef'];
      };
      cookie?: never;
    };
    requestBody?: {
      content: {
        'application/json': components['schemas']['TensorBoardRequest'];
      };
    };
    responses: {
      /** @description The TensorBoard's URL */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['TensorBoard'];
        };
      };
      /** @description Invalid body */
      400: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Error'];
        };
      };
      403: components['responses']['Forbidden'];
      404: components['responses']['UnknownJob'];
      /** @description A job has written no TensorBoard data yet (the message names the job and its directory) */
      409: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Error'];
        };
      };
      /** @description TensorBoard is not installed in the server's environment, or did not start */
      503: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Error'];
        };
      };
    };
  };
  getJobResult: {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description A job id, or a job name (then the newest job of that name). */
        id: components['parameters']['JobRef'];
      };
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description The result */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['JobResult'];
        };
      };
      403: components['responses']['Forbidden'];
      404: components['responses']['UnknownJob'];
      /** @description The job has not succeeded, or its result has no JSON form */
      409: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Error'];
        };
      };
    };
  };
  getCluster: {
    parameters: {
      query?: never;
      header?: never;
      path?: never;
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description The cluster */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Cluster'];
        };
      };
      403: components['responses']['Forbidden'];
      404: components['responses']['NotFound'];
    };
  };
  events: {
    parameters: {
      query?: never;
      header?: never;
      path?: never;
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description Switching to the websocket protocol */
      101: {
        headers: {
          [name: string]: unknown;
        };
        content?: never;
      };
      /** @description A malformed websocket handshake (tornado's answer) */
      400: {
        headers: {
          [name: string]: unknown;
        };
        content?: never;
      };
      403: components['responses']['Forbidden'];
      /** @description Not a websocket request */
      426: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Error'];
        };
      };
    };
  };
  openapi: {
    parameters: {
      query?: never;
      header?: never;
      path?: never;
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description The OpenAPI document */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': Record<string, never>;
        };
      };
      403: components['responses']['Forbidden'];
      404: components['responses']['NotFound'];
    };
  };
  listNotebooks: {
    parameters: {
      query?: never;
      header?: never;
      path?: never;
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description The user's notebook servers, by name */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['NotebookList'];
        };
      };
      403: components['responses']['NotebookForbidden'];
      404: components['responses']['NotFound'];
      502: components['responses']['ApiRefused'];
      503: components['responses']['NoCluster'];
    };
  };
  createNotebook: {
    parameters: {
      query?: never;
      header?: never;
      path?: never;
      cookie?: never;
    };
    requestBody: {
      content: {
        'application/json': components['schemas']['NotebookRequest'];
      };
    };
    responses: {
      /** @description The new notebook server */
      201: {
        headers: {
          Location?: string;
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Notebook'];
        };
      };
      /** @description Invalid body (e.g. a name the controller cannot use) */
      400: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Error'];
        };
      };
      /** @description Not authenticated or authorized, no identity header (trusted-header mode), or the user already has MLClusterApp.notebook_quota servers */
      403: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Error'];
        };
      };
      404: components['responses']['NotFound'];
      /** @description A notebook server of that name exists */
      409: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Error'];
        };
      };
      502: components['responses']['ApiRefused'];
      503: components['responses']['NoCluster'];
    };
  };
  getNotebook: {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description The notebook server's name. */
        name: components['parameters']['NotebookName'];
      };
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description The notebook server */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Notebook'];
        };
      };
      400: components['responses']['BadNotebookName'];
      403: components['responses']['NotebookForbidden'];
      404: components['responses']['UnknownNotebook'];
      502: components['responses']['ApiRefused'];
      503: components['responses']['NoCluster'];
    };
  };
  deleteNotebook: {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description The notebook server's name. */
        name: components['parameters']['NotebookName'];
      };
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description Being deleted (it lingers, phase deleting, until what it owns is gone) */
      204: {
        headers: {
          [name: string]: unknown;
        };
        content?: never;
      };
      400: components['responses']['BadNotebookName'];
      403: components['responses']['NotebookForbidden'];
      404: components['responses']['UnknownNotebook'];
      502: components['responses']['ApiRefused'];
      503: components['responses']['NoCluster'];
    };
  };
  stopNotebook: {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description The notebook server's name. */
        name: components['parameters']['NotebookName'];
      };
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description Stopping (annotation mlcluster.io/stopped set) */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Notebook'];
        };
      };
      400: components['responses']['BadNotebookName'];
      403: components['responses']['NotebookForbidden'];
      404: components['responses']['UnknownNotebook'];
      502: components['responses']['ApiRefused'];
      503: components['responses']['NoCluster'];
    };
  };
  startNotebook: {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description The notebook server's name. */
        name: components['parameters']['NotebookName'];
      };
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description Starting (annotation mlcluster.io/stopped removed) */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Notebook'];
        };
      };
      400: components['responses']['BadNotebookName'];
      403: components['responses']['NotebookForbidden'];
      404: components['responses']['UnknownNotebook'];
      502: components['responses']['ApiRefused'];
      503: components['responses']['NoCluster'];
    };
  };
  listSweeps: {
    parameters: {
      query?: never;
      header?: never;
      path?: never;
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description The sweeps */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['SweepList'];
        };
      };
      403: components['responses']['Forbidden'];
      404: components['responses']['NotFound'];
    };
  };
  getSweep: {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description A sweep's id. */
        id: components['parameters']['SweepId'];
      };
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description The sweep */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Sweep'];
        };
      };
      403: components['responses']['Forbidden'];
      404: components['responses']['UnknownSweep'];
    };
  };
  listSchedules: {
    parameters: {
      query?: never;
      header?: never;
      path?: never;
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description The schedules */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['ScheduleList'];
        };
      };
      403: components['responses']['Forbidden'];
      404: components['responses']['NotFound'];
    };
  };
  getSchedule: {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description A schedule's name. */
        name: components['parameters']['ScheduleName'];
      };
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description The schedule, its next tick and its last run */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Schedule'];
        };
      };
      403: components['responses']['Forbidden'];
      404: components['responses']['UnknownSchedule'];
    };
  };
  deleteSchedule: {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description A schedule's name. */
        name: components['parameters']['ScheduleName'];
      };
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description Deleted */
      204: {
        headers: {
          [name: string]: unknown;
        };
        content?: never;
      };
      403: components['responses']['Forbidden'];
      404: components['responses']['UnknownSchedule'];
    };
  };
  pauseSchedule: {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description A schedule's name. */
        name: components['parameters']['ScheduleName'];
      };
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description The schedule, suspended */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Schedule'];
        };
      };
      403: components['responses']['Forbidden'];
      404: components['responses']['UnknownSchedule'];
    };
  };
  resumeSchedule: {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description A schedule's name. */
        name: components['parameters']['ScheduleName'];
      };
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description The schedule, active */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['Schedule'];
        };
      };
      403: components['responses']['Forbidden'];
      404: components['responses']['UnknownSchedule'];
    };
  };
  listScheduleRuns: {
    parameters: {
      query?: never;
      header?: never;
      path: {
        /** @description A schedule's name. */
        name: components['parameters']['ScheduleName'];
      };
      cookie?: never;
    };
    requestBody?: never;
    responses: {
      /** @description The runs */
      200: {
        headers: {
          [name: string]: unknown;
        };
        content: {
          'application/json': components['schemas']['ScheduleRunList'];
        };
      };
      403: components['responses']['Forbidden'];
      404: components['responses']['UnknownSchedule'];
    };
  };
}
