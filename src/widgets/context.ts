/** What every part of the panel needs: the store, the API, commands and settings. */
import { CommandRegistry } from '@lumino/commands';
import * as React from 'react';

import { MlclusterApi } from '../model/api';
import { PanelStore } from '../model/store';
import { JobOrigin } from '../model/types';

export interface PanelSettings {
  /** Lines the log viewer keeps (older ones are dropped). */
  logTailLines: number;
  /** Follow (stream) logs of running jobs. */
  followLogs: boolean;
  /** Opening a job brings its notebook's tab forward when that notebook is open. */
  revealNotebook: boolean;
}

export const DEFAULT_SETTINGS: PanelSettings = {
  logTailLines: 100000,
  followLogs: true,
  revealNotebook: true
};

export interface PanelContextValue {
  store: PanelStore;
  api: MlclusterApi;
  commands: CommandRegistry;
  settings: PanelSettings;
  /** The path JupyterLab opens for the notebook a job came from, or null (see model/origin). */
  notebookPath?: (origin: JobOrigin | null | undefined) => string | null;
  /** Open that notebook, or bring its tab forward; undefined where no document manager exists. */
  openNotebook?: (path: string) => void;
  /** Bring that notebook's tab forward if it is open, without taking the focus; false if it is not open. */
  showOpenNotebook?: (path: string) => boolean;
}

export const PanelContext = React.createContext<PanelContextValue | null>(null);

export function usePanel(): PanelContextValue {
  const value = React.useContext(PanelContext);
  if (!value) {
    throw new Error('PanelContext is missing');
  }
  return value;
}

/** Re-render whenever the store changes. */
export function useStore(store: PanelStore): void {
  const [, setVersion] = React.useState(0);
  React.useEffect(() => store.subscribe(() => setVersion(v => v + 1)), [store]);
}

/** The current time, ticking every `ms` (ages and elapsed times stay true). */
export function useNow(ms = 1000): number {
  const [now, setNow] = React.useState(Date.now());
  React.useEffect(() => {
    const timer = setInterval(() => setNow(Date.now()), ms);
    return () => clearInterval(timer);
  }, [ms]);
  return now;
}

/**
 * A button's or a form's action: `busy` while it runs, the message of its error kept to
 * show (null: none), `after` called once it is over either way.
 */
export function useAction(after?: () => void): {
  busy: boolean;
  error: string | null;
  act: (action: () => Promise<unknown>) => Promise<void>;
} {
  const [busy, setBusy] = React.useState(false);
  const [error, setError] = React.useState<string | null>(null);
  const act = async (action: () => Promise<unknown>) => {
    setBusy(true);
    setError(null);
    try {
      await action();
    } catch (e) {
      setError(String((e as Error).message ?? e));
    } finally {
      setBusy(false);
      after?.();
    }
  };
  return { busy, error, act };
}

/** Enter or Space on a focusable non-button element acts like a click. */
export function onActivate(action: () => void) {
  return (event: React.KeyboardEvent) => {
    if (event.key === 'Enter' || event.key === ' ') {
      event.preventDefault();
      action();
    }
  };
}
