/**
 * Where a job came from, as the sidebar shows and opens it. Pure functions.
 *
 * A kernel learns its notebook from jupyter_server as an absolute file system path
 * (`JPY_SESSION_NAME`), while JupyterLab opens documents by their path relative to the
 * server's root. The running sessions know both the kernel and the relative path, so they are
 * asked first; the server root (JupyterLab's page config `serverRoot`, possibly `~/...`)
 * settles the rest.
 */
import { JobOrigin } from './types';

/** A running JupyterLab session, reduced to what matters here. */
export interface SessionRef {
  /** The document's path relative to the server root, e.g. "work/train.ipynb". */
  path: string;
  kernelId: string | null;
}

function toSlashes(path: string): string {
  return path.replace(/\\/g, '/');
}

function isAbsolute(path: string): boolean {
  return path.startsWith('/') || /^[A-Za-z]:\//.test(path);
}

/** `path` below `root` (both with forward slashes), relative to it; null when outside. */
function below(path: string, root: string): string | null {
  const base = root.endsWith('/') ? root : `${root}/`;
  return path.startsWith(base) ? path.slice(base.length) : null;
}

/**
 * The path JupyterLab opens for the job's notebook, or null when it cannot be known (not
 * from a notebook, or a notebook outside this server's root).
 */
export function notebookPath(
  origin: JobOrigin | null | undefined,
  sessions: Iterable<SessionRef>,
  serverRoot: string
): string | null {
  if (!origin) {
    return null;
  }
  const kernelId = origin.kernel_id;
  if (kernelId) {
    for (const session of sessions) {
      if (session.kernelId === kernelId && session.path) {
        return session.path;
      }
    }
  }
  if (!origin.notebook) {
    return null;
  }
  const path = toSlashes(origin.notebook);
  if (!isAbsolute(path)) {
    return path;
  }
  const root = toSlashes(serverRoot);
  if (isAbsolute(root)) {
    return below(path, root);
  }
  if (root.startsWith('~/')) {
    // The home directory is not in the page config: the root is the part after "~", found
    // in the path after some home directory.
    const tail = root.slice(1);
    const at = path.indexOf(`${tail}/`);
    return at > 0 ? path.slice(at + tail.length + 1) : null;
  }
  return null;
}

/** The notebook's file name for a compact label ("train.ipynb"), or null. */
export function notebookName(
  origin: JobOrigin | null | undefined
): string | null {
  const notebook = origin?.notebook;
  if (!notebook) {
    return null;
  }
  const parts = toSlashes(notebook).split('/');
  return parts[parts.length - 1] || null;
}
