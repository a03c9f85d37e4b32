import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { DockPanel } from '@lumino/widgets';

import { CommandIds, PALETTE_CATEGORY, addCommands } from './commands';
import { clusterIcon } from './icons';
import { MlclusterApi } from './model/api';
import { TENSORBOARD_ATTRIBUTE, tensorBoardJobId } from './model/monitor';
import { SessionRef, notebookPath } from './model/origin';
import { PanelStore, RefreshMode, StoreOptions } from './model/store';
import { serverTransport } from './transport';
import { SidebarPanel } from './widgets/SidebarPanel';
import { DEFAULT_SETTINGS, PanelSettings } from './widgets/context';

const PLUGIN_ID = 'jupyterlab-mlcluster:plugin';
const PANEL_ID = 'jupyterlab-mlcluster-sidebar';

interface Settings extends PanelSettings {
  refresh: RefreshMode;
  pollInterval: number;
}

function readSettings(settings: ISettingRegistry.ISettings | null): Settings {
  const get = <T>(key: string, fallback: T): T =>
    settings
      ? ((settings.composite[key] as T | undefined) ?? fallback)
      : fallback;
  return {
    refresh: get<RefreshMode>('refresh', 'live'),
    pollInterval: get('pollInterval', 5),
    logTailLines: get('logTailLines', DEFAULT_SETTINGS.logTailLines),
    followLogs: get('followLogs', DEFAULT_SETTINGS.followLogs),
    revealNotebook: get('revealNotebook', DEFAULT_SETTINGS.revealNotebook)
  };
}

function storeOptions(settings: Settings): StoreOptions {
  return { mode: settings.refresh, pollInterval: settings.pollInterval };
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'A sidebar of distributed jobs, cluster capacity and notebook servers.',
  autoStart: true,
  optional: [
    ILayoutRestorer,
    ICommandPalette,
    ISettingRegistry,
    IDocumentManager
  ],
  activate: async (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null,
    settingRegistry: ISettingRegistry | null,
    docManager: IDocumentManager | null
  ) => {
    let settings: ISettingRegistry.ISettings | null = null;
    if (settingRegistry) {
      try {
        settings = await settingRegistry.load(PLUGIN_ID);
      } catch (error) {
        console.warn(
          'jupyterlab-mlcluster: settings could not be loaded; using defaults.',
          error
        );
      }
    }
    const initial = readSettings(settings);

    const api = new MlclusterApi(
      serverTransport(app.serviceManager.serverSettings)
    );
    const store = new PanelStore(api, storeOptions(initial));
    const panel = new SidebarPanel({
      store,
      api,
      commands: app.commands,
      settings: initial,
      notebookPath: origin => {
        const sessions: SessionRef[] = Array.from(
          app.serviceManager.sessions.running(),
          session => ({
            path: session.path,
            kernelId: session.kernel?.id ?? null
          })
        );
        return notebookPath(
          origin,
          sessions,
          PageConfig.getOption('serverRoot')
        );
      },
      openNotebook: docManager
        ? path => void docManager.openOrReveal(path)
        : undefined,
      showOpenNotebook: docManager
        ? path => {
            const widget = docManager.findWidget(path);
            if (!widget) {
              return false;
            }
            // selectWidget shows the tab without activating it: activating would move the
            // keyboard focus out of the panel the user is working in.
            if (widget.parent instanceof DockPanel) {
              widget.parent.selectWidget(widget);
            } else {
              app.shell.activateById(widget.id);
            }
            return true;
          }
        : undefined
    });
    panel.id = PANEL_ID;
    panel.title.icon = clusterIcon;
    panel.title.caption = 'Distributed jobs';
    app.shell.add(panel, 'left', { rank: 600 });
    restorer?.add(panel, PANEL_ID);

    settings?.changed.connect(() => {
      const next = readSettings(settings);
      panel.settings = next;
      store.configure(storeOptions(next));
    });

    addCommands(
      app.commands,
      store,
      jobId => {
        if (jobId) {
          store.select(jobId);
        }
        app.shell.activateById(PANEL_ID);
      },
      (widget, id) => {
        // One tab per set of jobs: opening it again brings that tab forward.
        const open = Array.from(app.shell.widgets('main')).find(
          w => w.id === id
        );
        if (open) {
          widget.dispose();
          app.shell.activateById(id);
          return;
        }
        widget.id = id;
        app.shell.add(widget, 'main');
        app.shell.activateById(id);
      }
    );
    store.subscribe(() =>
      app.commands.notifyCommandChanged(CommandIds.cancelJob)
    );
    for (const command of [
      CommandIds.openPanel,
      CommandIds.cancelJob,
      CommandIds.deleteJob,
      CommandIds.refresh,
      CommandIds.openTensorBoard,
      CommandIds.compareTensorBoard
    ]) {
      palette?.addItem({ command, category: PALETTE_CATEGORY });
    }

    // The cell monitor's TensorBoard button (kernel/monitor.py): an element in a notebook
    // output naming its job; a click opens that job's TensorBoard like the sidebar's button.
    document.addEventListener('click', event => {
      const clicked =
        event.target instanceof Element
          ? event.target.closest(`[${TENSORBOARD_ATTRIBUTE}]`)
          : null;
      // Only in a notebook's outputs, and only a job id.
      const id = clicked?.closest('.jp-OutputArea-output')
        ? tensorBoardJobId(clicked.getAttribute(TENSORBOARD_ATTRIBUTE))
        : null;
      if (id) {
        event.preventDefault();
        void app.commands.execute(CommandIds.openTensorBoard, { id });
      }
    });

    // The sidebar is always present, so it stays current even while collapsed: the
    // event stream is cheap and the job count in the list must be right when opened.
    store.start();
  }
};

export default plugin;
