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
        // JupyterLab's default, `no-store`, makes ServerConnection append a cache buster
        // (`?1795317812852`) that the API rejects as an unknown query parameter. `no-cache`
        // never serves a stored answer either: each request goes to the server.
        { cache: 'no-cache', ...init },
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
