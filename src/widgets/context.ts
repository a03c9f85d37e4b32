/** What every part of the panel needs: the store, the API, commands and settings. */
import { CommandRegistry } from '@lumino/commands';
import * as React from 'react';

import { MlclusterApi } from '../model/api';
import { PanelStore } from '../model/store';

export interface PanelSettings {
  /** Lines the log viewer keeps (older ones are dropped). */
  logTailLines: number;
  /** Follow (stream) logs of running jobs. */
  followLogs: boolean;
}

export const DEFAULT_SETTINGS: PanelSettings = {
  logTailLines: 100000,
  followLogs: true
};

export interface PanelContextValue {
  store: PanelStore;
  api: MlclusterApi;
  commands: CommandRegistry;
  settings: PanelSettings;
  /** Reveal the notebook a job came from; undefined where no document manager exists. */
  openNotebook?: (path: string) => void;
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

/** Enter or Space on a focusable non-button element acts like a click. */
export function onActivate(action: () => void) {
  return (event: React.KeyboardEvent) => {
    if (event.key === 'Enter' || event.key === ' ') {
      event.preventDefault();
      action();
    }
  };
}
