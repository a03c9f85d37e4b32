import { NdjsonParser, readNdjson } from '../model/ndjson';

function streamOf(chunks: Uint8Array[]): ReadableStream<Uint8Array> {
  return new ReadableStream({
    start(controller) {
      chunks.forEach(c => controller.enqueue(c));
      controller.close();
    }
  });
}

async function collect<T>(gen: AsyncGenerator<T[]>): Promise<T[][]> {
  const out: T[][] = [];
  for await (const batch of gen) {
    out.push(batch);
  }
  return out;
}

describe('NDJSON parsing', () => {
  it('keeps a partial line for the next chunk', () => {
    const p = new NdjsonParser();
    expect(p.push('{"a":1}\n{"b"')).toEqual([{ a: 1 }]);
    expect(p.push(':2}\n')).toEqual([{ b: 2 }]);
    expect(p.push('{"c":3}')).toEqual([]);
    expect(p.flush()).toEqual([{ c: 3 }]);
    expect(p.flush()).toEqual([]);
  });

  it('skips blank lines and CRLF endings', () => {
    const p = new NdjsonParser();
    expect(p.push('\n{"a":1}\r\n\n  \n{"b":2}\n')).toEqual([
      { a: 1 },
      { b: 2 }
    ]);
  });

  it('a malformed line is an error, not silently lost output', () => {
    expect(() => new NdjsonParser().push('{"a":\n')).toThrow(SyntaxError);
  });

  it('decodes UTF-8 characters split across network chunks', async () => {
    const bytes = new TextEncoder().encode(
      '{"line":"épochs ✓ 学习"}\n{"line":"🚀"}'
    );
    // cut inside the multi-byte characters
    const chunks = [
      bytes.slice(0, 11),
      bytes.slice(11, 20),
      bytes.slice(20, 33),
      bytes.slice(33)
    ];
    const batches = await collect(
      readNdjson<{ line: string }>(streamOf(chunks))
    );
    expect(batches.flat().map(o => o.line)).toEqual(['épochs ✓ 学习', '🚀']);
  });

  it('yields one batch per chunk (one render per network read)', async () => {
    const enc = new TextEncoder();
    const chunks = [enc.encode('{"n":1}\n{"n":2}\n'), enc.encode('{"n":3}\n')];
    const batches = await collect(readNdjson<{ n: number }>(streamOf(chunks)));
    expect(batches).toEqual([[{ n: 1 }, { n: 2 }], [{ n: 3 }]]);
  });

  it('stopping early cancels the underlying stream', async () => {
    let cancelled = false;
    const body = new ReadableStream<Uint8Array>({
      pull(controller) {
        controller.enqueue(new TextEncoder().encode('{"n":1}\n'));
      },
      cancel() {
        cancelled = true;
      }
    });
    for await (const batch of readNdjson(body)) {
      expect(batch).toEqual([{ n: 1 }]);
      break;
    }
    expect(cancelled).toBe(true);
  });
});
