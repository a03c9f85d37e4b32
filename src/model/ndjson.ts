/**
 * Newline-delimited JSON, read incrementally: chunks from a streaming HTTP body may end in
 * the middle of a line (or of a UTF-8 character), so the partial tail is kept for the next
 * chunk.
 */

export class NdjsonParser<T = unknown> {
  private buffer = '';

  /** Feed one text chunk; returns the objects of every line it completed. */
  push(chunk: string): T[] {
    this.buffer += chunk;
    const end = this.buffer.lastIndexOf('\n');
    if (end < 0) {
      return [];
    }
    const complete = this.buffer.slice(0, end);
    this.buffer = this.buffer.slice(end + 1);
    return parseLines<T>(complete);
  }

  /** The stream ended: parse a last line that had no trailing newline. */
  flush(): T[] {
    const rest = this.buffer;
    this.buffer = '';
    return parseLines<T>(rest);
  }
}

function parseLines<T>(text: string): T[] {
  const out: T[] = [];
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line) {
      // A malformed line is the server's bug; failing loudly beats silently losing logs.
      out.push(JSON.parse(line) as T);
    }
  }
  return out;
}

/**
 * Read a streaming body as NDJSON, yielding the objects of each chunk as one batch
 * (so a view can render once per network chunk rather than once per line).
 */
export async function* readNdjson<T = unknown>(
  body: ReadableStream<Uint8Array>,
  signal?: AbortSignal
): AsyncGenerator<T[]> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  const parser = new NdjsonParser<T>();
  let finished = false;
  try {
    for (;;) {
      if (signal?.aborted) {
        return;
      }
      const { done, value } = await reader.read();
      if (done) {
        finished = true;
        break;
      }
      const batch = parser.push(decoder.decode(value, { stream: true }));
      if (batch.length) {
        yield batch;
      }
    }
    const last = parser.push(decoder.decode()).concat(parser.flush());
    if (last.length) {
      yield last;
    }
  } finally {
    if (!finished) {
      // Left early (aborted, or the consumer stopped): close the connection too.
      await reader.cancel().catch(() => undefined);
    }
    reader.releaseLock();
  }
}
