import { Dialog, showDialog } from '@jupyterlab/apputils';
import * as React from 'react';

import { asSentence, formatAge } from '../model/format';
import { NotebookServer } from '../model/types';
import { useAction, usePanel } from './context';

/** Kubernetes object names: DNS-1123 labels. */
const NAME_RE = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;

export function notebookStatus(
  nb: NotebookServer
): 'ready' | 'stopped' | 'failed' | 'starting' {
  const phase = (nb.phase ?? '').toLowerCase();
  if (nb.stopped || phase === 'stopped') {
    return 'stopped';
  }
  if (phase === 'failed' || phase === 'error') {
    return 'failed';
  }
  if (nb.ready || phase === 'running' || phase === 'ready') {
    return 'ready';
  }
  return 'starting';
}

/** Notebook statuses drawn in the colours of the job states that mean the same. */
const BADGE_COLOUR: Record<ReturnType<typeof notebookStatus>, string> = {
  ready: 'running',
  starting: 'starting',
  failed: 'failed',
  stopped: 'cancelled'
};

function NotebookRow({ nb, now }: { nb: NotebookServer; now: number }) {
  const { api } = usePanel();
  const { busy, error, act } = useAction();
  const status = notebookStatus(nb);
  // A stopped server can be started; any other can be stopped.
  const stopped = status === 'stopped';
  const toggleLabel = stopped ? 'Start' : 'Stop';
  const toggle = (name: string) =>
    stopped ? api.startNotebook(name) : api.stopNotebook(name);
  const remove = async () => {
    const result = await showDialog({
      title: `Delete notebook server ${nb.name}?`,
      body: 'Its pod and service are removed. A workspace volume, if any, is deleted with it.',
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Delete' })]
    });
    if (result.button.accept) {
      await act(() => api.deleteNotebook(nb.name));
    }
  };

  return (
    <li
      className={`jp-mlc-nb jp-mlc-nb-${status}`}
      aria-label={`Notebook server ${nb.name}: ${nb.phase}`}
    >
      <div className="jp-mlc-nb-head">
        <span className="jp-mlc-job-name">{nb.name}</span>
        <span className={`jp-mlc-state jp-mlc-state-${BADGE_COLOUR[status]}`}>
          <span className="jp-mlc-state-dot" aria-hidden="true" />
          {nb.phase || status}
        </span>
        {nb.created && (
          <span className="jp-mlc-hint">{formatAge(nb.created, now)}</span>
        )}
      </div>
      {status === 'starting' && (
        <div className="jp-mlc-nb-progress" role="status">
          <div
            className="jp-mlc-progress jp-mlc-progress-indeterminate"
            aria-hidden="true"
          >
            <div className="jp-mlc-progress-fill" />
          </div>
          <span className="jp-mlc-hint">{nb.message || 'Starting…'}</span>
        </div>
      )}
      {status !== 'starting' && nb.message && (
        <div className="jp-mlc-hint">{nb.message}</div>
      )}
      {error && (
        <div className="jp-mlc-banner jp-mlc-banner-error" role="alert">
          {error}
        </div>
      )}
      <div className="jp-mlc-actions">
        {status === 'ready' && nb.url && (
          <a
            className="jp-mlc-button jp-mlc-button-accept"
            href={nb.url}
            target="_blank"
            rel="noopener noreferrer"
            aria-label={`Open notebook server ${nb.name} in a new tab`}
          >
            Open
          </a>
        )}
        <button
          className="jp-mlc-button"
          disabled={busy}
          onClick={() => act(() => toggle(nb.name))}
          aria-label={`${toggleLabel} notebook server ${nb.name}`}
        >
          {toggleLabel}
        </button>
        <button
          className="jp-mlc-button"
          disabled={busy}
          onClick={remove}
          aria-label={`Delete notebook server ${nb.name}`}
        >
          Delete
        </button>
      </div>
    </li>
  );
}

function SpawnForm() {
  const { api, store } = usePanel();
  const [name, setName] = React.useState('');
  const [image, setImage] = React.useState('');
  const { busy, error, act } = useAction();
  const invalid = name !== '' && !NAME_RE.test(name);

  const submit = async (e: React.FormEvent) => {
    e.preventDefault();
    if (!name || invalid) {
      return;
    }
    await act(async () => {
      const nb = await api.spawnNotebook({ name, image: image || undefined });
      // Show it at once; its progress then comes from notebook events.
      store.dispatch({ type: 'notebook', notebook: nb });
      setName('');
      setImage('');
    });
  };

  return (
    <form
      className="jp-mlc-spawn"
      onSubmit={submit}
      aria-label="New notebook server"
    >
      <input
        className="jp-mlc-input"
        value={name}
        placeholder="name, e.g. my-notebook"
        aria-label="Name of the new notebook server"
        aria-invalid={invalid}
        onChange={e => setName(e.target.value.trim())}
      />
      <input
        className="jp-mlc-input"
        value={image}
        placeholder="image (optional)"
        aria-label="Container image of the new notebook server (optional)"
        onChange={e => setImage(e.target.value.trim())}
      />
      <button
        className="jp-mlc-button jp-mlc-button-accept"
        type="submit"
        disabled={busy || !name || invalid}
      >
        Spawn
      </button>
      {invalid && (
        <div className="jp-mlc-hint jp-mlc-invalid" role="alert">
          Lower-case letters, digits and “-”, starting and ending with a letter
          or digit.
        </div>
      )}
      {error && (
        <div className="jp-mlc-banner jp-mlc-banner-error" role="alert">
          {error}
        </div>
      )}
    </form>
  );
}

export function NotebooksSection({
  notebooks,
  now
}: {
  notebooks: Readonly<Record<string, NotebookServer>> | null;
  now: number;
}) {
  const { store } = usePanel();
  const error = store.notebooksError;
  if (error?.unavailable) {
    return (
      <div className="jp-mlc-empty jp-mlc-no-cluster" role="status">
        <p>
          <strong>No cluster configured.</strong>
        </p>
        <p className="jp-mlc-hint">{asSentence(error.message)}</p>
        <p className="jp-mlc-hint">
          Notebook servers run on Kubernetes; jobs still run on this machine.
        </p>
      </div>
    );
  }
  if (error?.missingExtension || (notebooks === null && store.problem)) {
    return (
      <div className="jp-mlc-hint">
        Unavailable until the server extension answers.
      </div>
    );
  }
  if (error) {
    return (
      <div className="jp-mlc-banner jp-mlc-banner-error" role="alert">
        {error.message}
      </div>
    );
  }
  if (notebooks === null) {
    return <div className="jp-mlc-hint">Loading…</div>;
  }
  const list = Object.values(notebooks).sort((a, b) =>
    a.name.localeCompare(b.name)
  );
  return (
    <div className="jp-mlc-notebooks">
      {list.length === 0 ? (
        <div className="jp-mlc-hint">You have no notebook servers.</div>
      ) : (
        <ul className="jp-mlc-nb-list" aria-label="Notebook servers">
          {list.map(nb => (
            <NotebookRow key={nb.name} nb={nb} now={now} />
          ))}
        </ul>
      )}
      <SpawnForm />
    </div>
  );
}
