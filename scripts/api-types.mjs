// The sidebar's TypeScript types of the REST API and /events, generated from the API
// document (jupyterlab_mlcluster/server/openapi.yaml) with openapi-typescript and formatted
// with the project's prettier settings, so src/model/types.ts cannot drift from the server.
// Only `components.schemas` is kept: the schemas are what the sidebar names (types.ts); the
// per-operation types openapi-typescript also writes (`paths`, `operations`, `responses`) are
// used nowhere and would repeat, operation by operation, the same parameter/response scaffold.
//
//   node scripts/api-types.mjs            write src/model/api-types.ts
//   node scripts/api-types.mjs --check    exit 1 if the committed file is not what it would write
//   (--out FILE: another file, for tests)
import { readFile, writeFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import openapiTS, { astToString } from 'openapi-typescript';
import * as prettier from 'prettier';
import ts from 'typescript';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const documentPath = path.join(root, 'jupyterlab_mlcluster', 'server', 'openapi.yaml');
const args = process.argv.slice(2);
const check = args.includes('--check');
const outIndex = args.indexOf('--out');
const out =
  outIndex >= 0
    ? path.resolve(args[outIndex + 1])
    : path.join(root, 'src', 'model', 'api-types.ts');

const HEADER = `/**
 * Generated from jupyterlab_mlcluster/server/openapi.yaml by scripts/api-types.mjs
 * (openapi-typescript): do not edit; run \`jlpm generate:types\` after changing the document.
 */

`;

/** The `components` interface of the generated statements, with only its `schemas`. */
function schemasOnly(statements) {
  const named = (node, name) => node.name && node.name.text === name;
  return statements
    .filter(node => ts.isInterfaceDeclaration(node) && named(node, 'components'))
    .map(node =>
      ts.factory.updateInterfaceDeclaration(
        node,
        node.modifiers,
        node.name,
        node.typeParameters,
        node.heritageClauses,
        node.members.filter(member => named(member, 'schemas'))
      )
    );
}

async function generate() {
  const ast = schemasOnly(await openapiTS(await readFile(documentPath, 'utf8')));
  const options = (await prettier.resolveConfig(out)) ?? {};
  return prettier.format(HEADER + astToString(ast), {
    ...options,
    parser: 'typescript'
  });
}

const text = await generate();
if (check) {
  const committed = await readFile(out, 'utf8').catch(() => '');
  if (committed !== text) {
    console.error(
      `${path.relative(root, out)} is not what ${path.relative(root, documentPath)} ` +
        'generates: run `jlpm generate:types` and commit the result.'
    );
    process.exit(1);
  }
} else {
  await writeFile(out, text);
}
