import * as http from 'http';

import { FollowOptions, FollowState, followLogs } from '../model/logs';
import { LogLine } from '../model/types';
import { TestServer, sendJson, serverForTests } from './helpers';

const FAST = { initial: 5, max: 20, jitter: 0 };

/** One rank's log, with cursors "0:<line index>" the way the server's byte offsets work. */
class FakeLog {
  lines: LogLine[] = [];
  pageSize = 3;
  /** What each follow connection does: (since index, response). */
  streams: Array<(since: number, res: http.ServerResponse) => void> = [];

  add(n: number): void {
    for (let i = 0; i < n; i++) {
      this.lines.push({
        rank: 0,
        ts: '2026-11-22T01:00:00.000Z',
        line: `line ${this.lines.length}`,
        stream: 'stdout'
      });
    }
  }

  /** A log of `lines` lines served as job `id`'s. */
  static serving(server: TestServer, id: string, lines = 0): FakeLog {
    const log = new FakeLog();
    log.add(lines);
    log.install(server, id);
    return log;
  }

  install(server: TestServer, id: string): void {
    server.route('GET', `jobs/${id}/logs`, (_req, res, url) => {
      const since = Number(
        (url.searchParams.get('since') ?? '0:0').split(':')[1]
      );
      if (url.searchParams.get('follow') === 'true') {
        const stream = this.streams.shift();
        res.writeHead(200, { 'Content-Type': 'application/x-ndjson' });
        if (stream) {
          stream(since, res);
        } else {
          res.end();
        }
        return;
      }
      const page = this.lines.slice(since, since + this.pageSize);
      sendJson(res, 200, { lines: page, cursor: `0:${since + page.length}` });
    });
  }
}

class Sink {
  lines: string[] = [];
  resets = 0;
  states: FollowState[] = [];
  append(lines: LogLine[]) {
    this.lines.push(...lines.map(l => l.line));
  }
  reset() {
    this.resets++;
    this.lines = [];
  }
  status(state: FollowState) {
    this.states.push(state);
  }
}

const names = (from: number, to: number) =>
  Array.from({ length: to - from }, (_, i) => `line ${from + i}`);

describe('following logs', () => {
  const { server, api } = serverForTests();

  /** Follow job `id`'s logs into a new Sink until it ends (`isActive` false). */
  const follow = async (
    id: string,
    isActive: () => boolean,
    options: Partial<FollowOptions> = {}
  ): Promise<Sink> => {
    const sink = new Sink();
    await followLogs(api, id, sink, {
      isActive,
      signal: new AbortController().signal,
      backoff: FAST,
      ...options
    });
    return sink;
  };

  it('a finished job: pages through with the cursor, then stops', async () => {
    FakeLog.serving(server, 'done1', 8);
    const sink = await follow('done1', () => false);
    expect(sink.lines).toEqual(names(0, 8));
    expect(sink.states).toEqual(['loading', 'done']);
    expect(server.requests.map(r => r.url.split('?')[1] ?? '')).toEqual([
      '',
      'since=0%3A3',
      'since=0%3A6',
      'since=0%3A8'
    ]);
  });

  it('a running job: streams from the cursor; resumes from the streamed cursor after a break', async () => {
    const log = FakeLog.serving(server, 'run1', 2);
    let active = true;
    log.streams.push((since, res) => {
      expect(since).toBe(2);
      res.write('{"rank":0,"line":"line 2","cursor":"0:3"}\n');
      res.write('{"rank":0,"line":"line 3","cursor":"0:4"}\n');
      setTimeout(() => res.destroy(), 20); // the server dies mid-job
    });
    log.streams.push((since, res) => {
      expect(since).toBe(4);
      res.write('{"rank":0,"line":"line 4","cursor":"0:5"}\n');
      active = false; // the job ends
      res.end();
    });
    const sink = await follow('run1', () => active);
    expect(sink.lines).toEqual(names(0, 5));
    expect(sink.resets).toBe(0);
    expect(sink.states).toEqual([
      'loading',
      'following',
      'reconnecting',
      'following',
      'done'
    ]);
  });

  it('without cursors in the stream, a break reloads from the start (no duplicates)', async () => {
    const log = FakeLog.serving(server, 'run2', 2);
    let active = true;
    log.streams.push((_since, res) => {
      log.add(1);
      res.write(JSON.stringify(log.lines[2]) + '\n');
      setTimeout(() => res.destroy(), 20);
    });
    log.streams.push((since, res) => {
      expect(since).toBe(3);
      active = false;
      res.end();
    });
    const sink = await follow('run2', () => active);
    expect(sink.resets).toBe(1);
    expect(sink.lines).toEqual(names(0, 3));
  });

  it('gives up after repeated failures with an error state', async () => {
    server.json('GET', 'jobs/broken/logs', 500, { message: 'disk on fire' });
    const sink = await follow('broken', () => true, { maxFailures: 3 });
    expect(sink.states).toEqual([
      'loading',
      'reconnecting',
      'reconnecting',
      'error'
    ]);
  });

  it('abort stops it at once', async () => {
    const log = FakeLog.serving(server, 'run3');
    log.streams.push((_since, res) => res.write('{"rank":0,"line":"hello"}\n'));
    const controller = new AbortController();
    const sink = new Sink();
    const running = followLogs(api, 'run3', sink, {
      isActive: () => true,
      signal: controller.signal
    });
    while (sink.lines.length === 0) {
      await new Promise(r => setTimeout(r, 10));
    }
    controller.abort();
    await running;
    expect(sink.lines).toEqual(['hello']);
    expect(sink.states).toEqual(['loading', 'following']);
  });
});
