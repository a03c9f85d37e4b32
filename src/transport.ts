/** The API transport inside JupyterLab: base URL, token and XSRF as every Jupyter API. */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { Transport } from './model/api';

export function serverTransport(
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Transport {
  return {
    request: (path, init) =>
      ServerConnection.makeRequest(
        URLExt.join(settings.baseUrl, path),
        init ?? {},
        settings
      ),
    websocketUrl: path => {
      // As @jupyterlab/services does for kernel channels: same-origin sockets carry the
      // login cookie, a token is appended only where the settings ask for it.
      const url = URLExt.join(settings.wsUrl, path);
      return settings.appendToken && settings.token
        ? `${url}?token=${encodeURIComponent(settings.token)}`
        : url;
    }
  };
}
