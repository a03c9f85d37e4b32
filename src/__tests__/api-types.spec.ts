/**
 * The sidebar's API types are generated from the server's API document
 * (jupyterlab_mlcluster/server/openapi.yaml): the committed file must be exactly what
 * regeneration writes, so a change of the document that the sidebar has not taken up fails.
 */
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

const root = path.resolve(__dirname, '..', '..');
const script = path.join(root, 'scripts', 'api-types.mjs');
const committed = path.join(root, 'src', 'model', 'api-types.ts');

function check(out?: string) {
  const args = [script, '--check', ...(out ? ['--out', out] : [])];
  return spawnSync(process.execPath, args, { cwd: root, encoding: 'utf8' });
}

describe('generated API types', () => {
  it('src/model/api-types.ts is what the API document generates', () => {
    const result = check();
    expect(result.stderr).toBe('');
    expect(result.status).toBe(0);
  });

  it('a file that drifted from the document fails the check', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'mlc-api-types-'));
    try {
      const drifted = path.join(dir, 'api-types.ts');
      const text = fs.readFileSync(committed, 'utf8');
      fs.writeFileSync(
        drifted,
        text.replace('workers: number;', 'workers?: number;')
      );
      const result = check(drifted);
      expect(result.status).toBe(1);
      expect(result.stderr).toContain('jlpm generate:types');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
