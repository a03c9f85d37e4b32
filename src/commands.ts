/** The extension's commands: the panel's buttons run them too, so both ask the same questions. */
import {
  Dialog,
  IFrame,
  InputDialog,
  MainAreaWidget,
  showDialog,
  showErrorMessage
} from '@jupyterlab/apputils';
import { CommandRegistry } from '@lumino/commands';

import { EXPORT_TARGETS, ExportTarget } from './model/api';
import { isFinal, sortedJobs } from './model/reducer';
import { PanelStore } from './model/store';
import { Job } from './model/types';

export namespace CommandIds {
  export const openPanel = 'mlcluster:open-panel';
  export const cancelJob = 'mlcluster:cancel-job';
  export const deleteJob = 'mlcluster:delete-job';
  export const refresh = 'mlcluster:refresh';
  export const openTensorBoard = 'mlcluster:open-tensorboard';
  export const compareTensorBoard = 'mlcluster:compare-tensorboard';
  export const exportJob = 'mlcluster:export-job';
}

export const PALETTE_CATEGORY = 'Distributed Jobs';

/** The job a command acts on: its `id` argument, else the one on screen, else ask. */
async function pickJob(
  store: PanelStore,
  args: { id?: unknown },
  candidates: Job[],
  verb: string
): Promise<Job | null> {
  const id = typeof args.id === 'string' ? args.id : store.selectedJob;
  if (id) {
    return store.state.jobs[id] ?? null;
  }
  if (candidates.length === 0) {
    await showDialog({
      title: `No job to ${verb}`,
      body:
        verb === 'cancel'
          ? 'No distributed job is queued or running.'
          : 'There are no jobs.',
      buttons: [Dialog.okButton()]
    });
    return null;
  }
  const labels = candidates.map(
    job => `${job.name} · ${job.state} · ${job.id}`
  );
  const choice = await InputDialog.getItem({
    title: `Which job do you want to ${verb}?`,
    items: labels
  });
  if (!choice.button.accept || choice.value === null) {
    return null;
  }
  return candidates[labels.indexOf(choice.value)] ?? null;
}

/** A tab showing a page of this server (TensorBoard through its authenticated proxy). */
export function serverPageTab(
  url: string,
  label: string
): MainAreaWidget<IFrame> {
  // TensorBoard's page must run its scripts and fetch its data with the server's cookie;
  // it is served by this server's own origin, behind its authentication.
  const frame = new IFrame({
    sandbox: [
      'allow-scripts',
      'allow-same-origin',
      'allow-downloads',
      'allow-popups'
    ]
  });
  frame.url = url;
  const widget = new MainAreaWidget({ content: frame });
  widget.title.label = label;
  widget.title.closable = true;
  widget.addClass('jp-mlc-tensorboard');
  return widget;
}

/** The export targets as the dialog offers them. */
const EXPORT_TARGET_LABELS: [ExportTarget, string][] = [
  ['script', 'script: the cell, and run.sh (torchrun on one machine)'],
  ['sbatch', 'sbatch: a Slurm batch file'],
  ['trainjob', 'trainjob: a Kubeflow Trainer TrainJob'],
  ['pytorchjob', 'pytorchjob: a Kubeflow Training Operator PyTorchJob']
];

/** Hand `data` to the browser as a download named `name`. */
function download(data: Blob, name: string): void {
  const url = URL.createObjectURL(data);
  const link = document.createElement('a');
  link.href = url;
  link.download = name;
  document.body.appendChild(link);
  link.click();
  link.remove();
  // After the click has handed it over (revoking at once can cancel it in some browsers).
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

/** Ask `question`; if accepted, run `action`, and show `failure` with its error if it fails. */
async function ifConfirmed(
  question: Partial<Dialog.IOptions<unknown>>,
  failure: string,
  action: () => Promise<unknown>
): Promise<void> {
  const answer = await showDialog(question);
  if (!answer.button.accept) {
    return;
  }
  try {
    await action();
  } catch (error) {
    await showErrorMessage(failure, error as Error);
  }
}

export function addCommands(
  commands: CommandRegistry,
  store: PanelStore,
  openPanel: (jobId?: string) => void,
  openTab?: (widget: MainAreaWidget, id: string) => void
): void {
  commands.addCommand(CommandIds.openPanel, {
    label: 'Open Distributed Jobs Panel',
    caption:
      'Show the sidebar of distributed jobs (optionally one job: args.id)',
    execute: args =>
      openPanel(typeof args.id === 'string' ? args.id : undefined)
  });

  commands.addCommand(CommandIds.cancelJob, {
    label: args => (args.id ? 'Cancel Job' : 'Cancel Distributed Job…'),
    caption: 'Stop a queued or running distributed job',
    isEnabled: () => sortedJobs(store.state.jobs).some(job => !isFinal(job)),
    execute: async args => {
      const active = sortedJobs(store.state.jobs).filter(job => !isFinal(job));
      const job = await pickJob(store, args, active, 'cancel');
      if (!job || isFinal(job)) {
        return;
      }
      await ifConfirmed(
        {
          title: `Cancel job ${job.name}?`,
          body: `Its ${job.workers} rank${job.workers === 1 ? '' : 's'} will be stopped. Logs and metrics are kept.`,
          buttons: [
            Dialog.cancelButton({ label: 'Keep running' }),
            Dialog.warnButton({ label: 'Cancel job' })
          ]
        },
        `Could not cancel ${job.name}`,
        () => store.api.cancelJob(job.id)
      );
    }
  });

  commands.addCommand(CommandIds.deleteJob, {
    label: args => (args.id ? 'Delete Job' : 'Delete Distributed Job…'),
    caption: 'Cancel a job if needed and forget it, with its logs and metrics',
    isEnabled: () => Object.keys(store.state.jobs).length > 0,
    execute: async args => {
      const job = await pickJob(
        store,
        args,
        sortedJobs(store.state.jobs),
        'delete'
      );
      if (!job) {
        return;
      }
      await ifConfirmed(
        {
          title: `Delete job ${job.name}?`,
          body: isFinal(job)
            ? 'Its logs, metrics and result are deleted. This cannot be undone.'
            : 'It is still active: it will be cancelled, then its logs, metrics and result deleted. This cannot be undone.',
          buttons: [
            Dialog.cancelButton(),
            Dialog.warnButton({ label: 'Delete' })
          ]
        },
        `Could not delete ${job.name}`,
        async () => {
          await store.api.deleteJob(job.id);
          if (store.selectedJob === job.id) {
            store.select(null);
          }
        }
      );
    }
  });

  commands.addCommand(CommandIds.openTensorBoard, {
    label: args => (args.id ? 'TensorBoard' : 'Open TensorBoard of a Job…'),
    caption:
      "Open a TensorBoard over the job's $MLCLUSTER_TENSORBOARD_DIR in a tab (args.id; args.compare: more job ids)",
    isEnabled: () => openTab !== undefined,
    execute: async args => {
      // A job the panel has not heard of yet (a cell monitor's button can be quicker than
      // the event stream) is still opened by id: the server says whether it may be.
      const unseen =
        typeof args.id === 'string' && !(args.id in store.state.jobs)
          ? { id: args.id, name: args.id }
          : null;
      const job =
        unseen ??
        (await pickJob(
          store,
          args,
          sortedJobs(store.state.jobs),
          'show in TensorBoard'
        ));
      if (!job || !openTab) {
        return;
      }
      const others = Array.isArray(args.compare)
        ? args.compare.filter((id): id is string => typeof id === 'string')
        : [];
      try {
        const answer = await store.api.openTensorBoard(job.id, others);
        const names = others.map(id => store.state.jobs[id]?.name ?? id);
        const label = `TensorBoard: ${[job.name, ...names].join(', ')}`;
        openTab(
          serverPageTab(answer.url, label),
          `mlcluster-tb-${answer.jobs.join('-')}`
        );
      } catch (error) {
        await showErrorMessage(
          `No TensorBoard for ${job.name}`,
          error as Error
        );
      }
    }
  });

  commands.addCommand(CommandIds.compareTensorBoard, {
    label: args =>
      args.id ? 'Compare in TensorBoard…' : 'Compare Jobs in TensorBoard…',
    caption:
      'Open one TensorBoard over several jobs, one run per job (args.id: chosen already)',
    isEnabled: () =>
      openTab !== undefined && Object.keys(store.state.jobs).length > 1,
    execute: async args => {
      const jobs = sortedJobs(store.state.jobs);
      const labels = jobs.map(job => `${job.name} · ${job.state} · ${job.id}`);
      const choice = await InputDialog.getMultipleItems({
        title: 'Compare which jobs in one TensorBoard?',
        items: labels,
        defaults: labels.filter((_, i) => jobs[i].id === args.id)
      });
      const ids = (choice.button.accept ? (choice.value ?? []) : [])
        .map(label => jobs[labels.indexOf(label)]?.id)
        .filter((id): id is string => id !== undefined);
      if (ids.length > 0) {
        await commands.execute(CommandIds.openTensorBoard, {
          id: ids[0],
          compare: ids.slice(1)
        });
      }
    }
  });

  commands.addCommand(CommandIds.exportJob, {
    label: args => (args.id ? 'Export…' : 'Export a Distributed Job…'),
    caption:
      'Download what runs a job again outside the notebook: the cell as a script, its pushed variables, requirements, and run.sh, an sbatch file, a TrainJob or a PyTorchJob (args.id, args.as)',
    execute: async args => {
      const job = await pickJob(
        store,
        args,
        sortedJobs(store.state.jobs),
        'export'
      );
      if (!job) {
        return;
      }
      let target = EXPORT_TARGETS.find(t => t === args.as);
      if (!target) {
        const labels = EXPORT_TARGET_LABELS.map(([, label]) => label);
        const choice = await InputDialog.getItem({
          title: `Export ${job.name} as…`,
          items: labels
        });
        if (!choice.button.accept || choice.value === null) {
          return;
        }
        target = EXPORT_TARGET_LABELS[labels.indexOf(choice.value)]?.[0];
      }
      if (!target) {
        return;
      }
      let image = typeof args.image === 'string' ? args.image : undefined;
      const kube = target === 'trainjob' || target === 'pytorchjob';
      if (kube && !image && !job.image) {
        const answer = await InputDialog.getText({
          title: `The image ${job.name}'s pods run`,
          placeholder:
            "e.g. pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime (empty: the server's default)"
        });
        if (!answer.button.accept) {
          return;
        }
        image = answer.value || undefined;
      }
      try {
        const zip = await store.api.exportJob(job.id, target, image);
        download(zip, `${job.name}-${target}.zip`);
      } catch (error) {
        await showErrorMessage(`Could not export ${job.name}`, error as Error);
      }
    }
  });

  commands.addCommand(CommandIds.refresh, {
    label: 'Refresh Distributed Jobs',
    caption: 'Reconnect to the server now and reload the lists',
    execute: () => store.refreshNow()
  });
}
