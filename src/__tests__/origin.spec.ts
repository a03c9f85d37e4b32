import { SessionRef, notebookName, notebookPath } from '../model/origin';
import { JobOrigin } from '../model/types';

const sessions: SessionRef[] = [
  { path: 'work/other.ipynb', kernelId: 'k-other' },
  { path: 'work/train.ipynb', kernelId: 'k-train' }
];

describe('the notebook a job came from', () => {
  it('is the running session of its kernel, whatever path the kernel was told', () => {
    expect(
      notebookPath(
        { kernel_id: 'k-train', notebook: '/srv/lab/work/train.ipynb' },
        sessions,
        '/somewhere/else'
      )
    ).toBe('work/train.ipynb');
  });

  it('is the absolute path made relative to the server root when the kernel is gone', () => {
    const origin = {
      kernel_id: 'k-gone',
      notebook: '/srv/lab/work/train.ipynb'
    };
    expect(notebookPath(origin, sessions, '/srv/lab')).toBe('work/train.ipynb');
    expect(notebookPath(origin, [], '/srv/lab/')).toBe('work/train.ipynb');
    // a root that is only a prefix of a directory name is not the root
    expect(notebookPath(origin, [], '/srv/la')).toBeNull();
    // outside the root: JupyterLab cannot open it
    expect(notebookPath(origin, [], '/home/ada')).toBeNull();
  });

  it('understands a root under the home directory ("~/...")', () => {
    expect(
      notebookPath(
        { notebook: '/home/ada/projects/x/train.ipynb' },
        [],
        '~/projects'
      )
    ).toBe('x/train.ipynb');
    expect(
      notebookPath(
        { notebook: '/home/ada/elsewhere/train.ipynb' },
        [],
        '~/projects'
      )
    ).toBeNull();
    // the root is the home directory itself: unknown without the session
    expect(
      notebookPath({ notebook: '/home/ada/train.ipynb' }, [], '~')
    ).toBeNull();
  });

  it('keeps a path that is already relative, and Windows paths work too', () => {
    expect(notebookPath({ notebook: 'train.ipynb' }, [], '/srv')).toBe(
      'train.ipynb'
    );
    expect(
      notebookPath(
        { notebook: 'C:\\Users\\ada\\lab\\nb\\train.ipynb' },
        [],
        'C:/Users/ada/lab'
      )
    ).toBe('nb/train.ipynb');
  });

  it('is nothing for jobs not started from a notebook', () => {
    expect(notebookPath(null, sessions, '/srv')).toBeNull();
    expect(notebookPath({ kind: 'rest' }, sessions, '/srv')).toBeNull();
    expect(
      notebookPath({ kind: 'kernel', kernel_id: 'k-unknown' }, sessions, '/srv')
    ).toBeNull();
  });

  it('has a short name for the job list', () => {
    expect(notebookName({ notebook: '/srv/lab/work/train.ipynb' })).toBe(
      'train.ipynb'
    );
    expect(notebookName({ notebook: 'C:\\lab\\train.ipynb' })).toBe(
      'train.ipynb'
    );
    // A malformed origin from an older server is not trusted either.
    expect(notebookName({ notebook: null } as unknown as JobOrigin)).toBeNull();
    expect(notebookName(undefined)).toBeNull();
  });
});
