/**
 * Generated from jupyterlab_mlcluster/server/openapi.yaml by scripts/api-types.mjs
 * (openapi-typescript): do not edit; run `jlpm generate:types` after changing the document.
 */

export interface components {
  schemas: {
    /**
     * @description A job's state: queued, then starting and running, then one of the three final states.
     * @enum {unknown}
     */
    JobState:
      'queued' | 'starting' | 'running' | 'succeeded' | 'failed' | 'cancelled';
    /**
     * @description Where a job runs: processes on this machine, pods in a Kubernetes cluster, or tasks of a Slurm allocation.
     * @enum {unknown}
     */
    Backend: 'local' | 'kubernetes' | 'slurm';
    /**
     * @description The distributed framework the ranks are set up for (`none`: rank environment only).
     * @enum {unknown}
     */
    Framework: 'pytorch' | 'tensorflow' | 'jax' | 'none';
    Trial: {
      trial: number;
      /** @description The swept names and this trial's values (non-JSON values as their repr) */
      params: Record<string, never>;
      job_id: string;
      state: components['schemas']['JobState'];
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
      backend: components['schemas']['Backend'];
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
    /** @description A user's named gang of live ranks that %%distributed --session cells run on (jobs/sessions.py); its ranks keep their globals from cell to cell. */
    Session: {
      name: string;
      owner: string | null;
      /** @description The session's gang as a job (GET /jobs/{id}); its cells are jobs whose `session.id` is this */
      id: string;
      state: components['schemas']['JobState'];
      /** @description Why it is where it is (e.g. how it ended) */
      reason: string | null;
      backend: components['schemas']['Backend'];
      workers: number;
      gpus_per_worker: number;
      gpus: number;
      /** @description The ranks' resident memory, summed (latest samples) */
      memory_bytes: number | null;
      /** @description Cells run in it */
      cells: number;
      restarts: number;
      /** Format: date-time */
      created: string;
      /** Format: date-time */
      finished: string | null;
      /**
       * Format: date-time
       * @description Since when no cell ran (it ends after MLClusterConfig.session_idle_timeout)
       */
      idle_since: string | null;
      /** Format: date-time */
      gpu_idle_since: string | null;
      ranks: components['schemas']['Rank'][];
    };
    SessionList: {
      sessions: components['schemas']['Session'][];
    };
    ScheduleList: {
      schedules: components['schemas']['Schedule'][];
    };
    Error: {
      message: string;
    };
    /** @description The %%distributed options in snake_case, plus the code every rank runs. A `backend` left out is MLClusterConfig.default_backend, except on a server shared by many users (per-user namespaces), where it is `kubernetes` and `local` is refused (403). */
    JobSubmission: {
      /** @description Python source run as __main__ on every rank. */
      code: string;
      workers?: number;
      gpus_per_worker?: number;
      cpus?: number;
      /** @description Memory per rank: bytes, or a size like '4Gi', '512Mi', '2GB'. */
      memory?: number | string;
      framework?: components['schemas']['Framework'];
      backend?: components['schemas']['Backend'];
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
      /**
       * @description Record the job as one MLflow run (options and pushed scalars as params, rank 0's logged series as metrics, logs and result as artifacts) at the server's MLClusterConfig.mlflow_tracking_uri (default: MLflow's local store). Default: MLClusterConfig.track (none).
       * @enum {unknown}
       */
      track?: 'none' | 'mlflow';
      /** @description Default true. Kubernetes, when the job runs the notebook pod's own image: install in each job pod, before the code runs, the packages installed in the notebook's environment since its pod started (false: --no-sync-packages). */
      sync_packages?: boolean;
      /** @description A rank without output, progress or CPU this long is stalled: seconds, or a duration like '5m'; 0 never. Default: MLClusterConfig.stall_after (5 minutes). The local and Slurm backends watch for stalls. */
      stall_after?: number | string;
      on_stall?: components['schemas']['OnStall'];
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
      state: components['schemas']['JobState'];
      backend: components['schemas']['Backend'];
      workers: number;
      gpus_per_worker: number;
      cpus: number;
      memory: number | null;
      framework: components['schemas']['Framework'];
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
      /** @description The id of what this job is listed under: a session's cell, its session's job (`session.id`); a sweep's trial, its sweep (`sweep.id`); null for a job at the top level. GET /jobs?parent= lists a group. */
      parent: string | null;
      /** @description A sweep's trial names its sweep (GET /sweeps/{id}); null for other jobs */
      sweep: null | {
        id: string;
        trial: number;
        parallel?: number | null;
        /** @description The sweep's name (absent for trials stored before it was kept) */
        name?: string;
      };
      /** @description A session's gang (`cell` false) or one of the cells run on it (`cell` true); null for other jobs */
      session: null | {
        name: string;
        /** @description The session's gang job */
        id: string;
        cell: boolean;
      };
      /** @description The job's --stall-after in seconds (null: the setting's; 0: never) */
      stall_after: number | null;
      on_stall: components['schemas']['OnStall'];
      /** @description Set while ranks of the running job are stalled (no output, progress or CPU for its stall_after); null otherwise. `where` is their folded stacks, taken when the stall was seen (GET /jobs/{id}/stacks has them whole). */
      stall: null | components['schemas']['Stall'];
      /** @description A job that may restart (max_restarts over 0), each ended attempt, oldest first (the first and the last 49 of a job restarted more often); empty otherwise. */
      attempts: components['schemas']['Attempt'][];
      /** @description Set while ranks of the running job straggle (their step rate, from mlc.progress or tqdm, 1.5x under their peers' median over MLClusterConfig.straggler_after, 30 s); null otherwise. */
      straggler: null | components['schemas']['Straggler'];
      /**
       * Format: date-time
       * @description Set while the job runs and every GPU its ranks report on has stayed under MLClusterConfig.idle_gpu_percent utilisation (5) since this time, for at least MLClusterConfig.idle_gpu_after seconds (600); null otherwise.
       */
      gpu_idle_since: string | null;
      /** @description The MLflow run this job records into (`--track mlflow`); null for a job not tracked. */
      tracking: null | components['schemas']['Tracking'];
      ranks: components['schemas']['Rank'][];
    };
    /**
     * @description What a stall does: warn (flag it; the default) or cancel (end the job, failed, with the stacks as its reason).
     * @enum {unknown}
     */
    OnStall: 'warn' | 'cancel';
    Stall: {
      ranks: number[];
      /**
       * Format: date-time
       * @description Since when the ranks have done nothing (the earliest of them)
       */
      since: string;
      /** @description The folded stacks, one line per fold: 'ranks 0, 2: all_reduce ← step (train.py:42)' */
      where: string[];
    };
    Straggler: {
      ranks: number[];
      /**
       * Format: date-time
       * @description Since when these ranks have been named stragglers
       */
      since: string;
      /** @description Each straggler's steps per second over the window, by rank */
      rates: {
        [key: string]: number;
      };
      /** @description The median step rate of all ranks reporting progress */
      median: number;
    };
    Attempt: {
      /** @description Its number, as its ranks' TORCHELASTIC_RESTART_COUNT */
      attempt: number;
      /** Format: date-time */
      started: string;
      /** Format: date-time */
      ended: string;
      /** @enum {string} */
      outcome: 'succeeded' | 'failed' | 'cancelled' | 'timeout';
      /** @description Why it ended (the failing rank's error, a preemption, an eviction, a cancel's reason); null for one that succeeded */
      reason: string | null;
      failed_rank: number | null;
      /** @description Whether the whole gang was started again after it */
      restarted: boolean;
    };
    StackFrame: {
      name: string;
      file: string;
      line: number;
      native: boolean;
      /** @description The source line of the user's own frames, where it could be read */
      code: string;
    };
    /** @description One stack, with every rank (and the thread) that is in it */
    StackFold: {
      ranks: number[];
      thread: string;
      /** @description The ranks' main threads (where each rank is) */
      main: boolean;
      /** @description The innermost frame, and the user's frame it was called from: 'all_reduce ← train_step (train.py:42)' */
      summary: string;
      /** @description 'ranks 0, 2, 3: all_reduce ← train_step (train.py:42)' */
      text: string;
      /** @description Innermost first */
      frames: components['schemas']['StackFrame'][];
    };
    StackThread: {
      name: string;
      id: number | null;
      main: boolean;
      active: boolean | null;
      /** @description Holds the GIL (where the reader can tell) */
      gil: boolean | null;
      frames: components['schemas']['StackFrame'][];
    };
    StackRank: {
      rank: number;
      pid: number | null;
      reader: string;
      threads: components['schemas']['StackThread'][];
    };
    /** @description Every thread's stack of every rank asked for, folded; ranks that could not be read are in `missing` with why (then `complete` is false). */
    StackReport: {
      job: string;
      /** Format: date-time */
      taken: string;
      taken_epoch: number;
      /** @description asked (live), stalled, cancelled, timeout or failed (kept with the job) */
      why: string;
      /** @description Taken now (false - kept with the job, taken earlier) */
      live: boolean;
      native: boolean;
      /** @description How long reading took */
      seconds: number;
      /** @description Which reader read the ranks: py-spy, py-spy --native, or the rank's own helper (faulthandler) where ptrace was refused, saying why */
      readers: string[];
      complete: boolean;
      missing: {
        rank: number;
        why: string;
      }[];
      folds: components['schemas']['StackFold'][];
      ranks: components['schemas']['StackRank'][];
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
      logged: components['schemas']['LoggedSeries'];
    };
    Tracking: {
      /** @enum {unknown} */
      kind: 'mlflow';
      /** @description The tracking URI the run is in. */
      uri: string;
      /** @description Null until the run is made. */
      run_id: string | null;
      /** @description The run's page on a tracking server (null for a local store, which `mlflow ui` serves). */
      url: string | null;
      /**
       * @description unreachable: the tracker cannot be reached now and is retried with backoff (the job runs on regardless; `message` says why).
       * @enum {unknown}
       */
      state: 'pending' | 'active' | 'unreachable' | 'finished';
      message: string | null;
    };
    /** @description What the job logged (`mlc.log` and what fills it). Every point is kept in the store; each series is one rank's, in the order its points came (a restart may step back). */
    LoggedSeries: {
      /** @description Every series name the job has logged so far, sorted. */
      names: string[];
      /** @description The requested series, one entry per name and rank. */
      series: components['schemas']['LoggedSeriesData'][];
      /** @description Pass as `after` to get only the points stored since this answer. */
      cursor: number;
      /** @description One answer reads a bounded part of the store: true when more points may follow the cursor (ask again with `after: cursor` until it is false). */
      more: boolean;
    };
    LoggedSeriesData: {
      name: string;
      rank: number;
      steps: number[];
      values: number[];
      /** @description Epoch seconds at which the rank logged each point. */
      times: number[];
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
      backend: components['schemas']['Backend'];
      capacity: {
        gpus: components['schemas']['Capacity'];
        cpus: components['schemas']['Capacity'];
        memory: components['schemas']['Capacity'];
      };
      /** @description Queued job ids in admission order. */
      queue: string[];
      running?: string[];
      /** @description The slurm backend only: every partition's CPUs and GPUs, total and idle, as sinfo tells them (`capacity` is then the default partition's, or MLClusterConfig.slurm_partition's). */
      partitions?: {
        name: string;
        default: boolean;
        nodes: number;
        cpus: components['schemas']['Capacity'];
        gpus: components['schemas']['Capacity'];
      }[];
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
    Event: {
      seq?: components['schemas']['Seq'];
    } & (
      | {
          /** @constant */
          type: 'snapshot';
          jobs: components['schemas']['Job'][];
          total?: number;
          cluster: components['schemas']['Cluster'];
        }
      | {
          /** @constant */
          type: 'job';
          job: components['schemas']['Job'];
        }
      | {
          /** @enum {unknown} */
          type: 'deleted' | 'logs';
          id: string;
        }
      | {
          /** @constant */
          type: 'cluster';
          cluster: components['schemas']['Cluster'];
        }
      | {
          /** @constant */
          type: 'notebook';
          notebook: components['schemas']['Notebook'];
        }
      | {
          /** @constant */
          type: 'notebook_deleted';
          name: string;
        }
    );
  };
}
