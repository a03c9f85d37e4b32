import * as React from 'react';

import { FollowState, followLogs } from '../model/logs';
import { isFinal } from '../model/reducer';
import { Job, LogLine } from '../model/types';
import {
  TailBuffer,
  bottomScrollTop,
  isAtBottom,
  visibleWindow
} from '../model/virtual';
import { usePanel } from './context';

/** Must match `.jp-mlc-log-row` height in style/base.css. */
export const LOG_ROW_HEIGHT = 18;

const STATUS_TEXT: Record<FollowState, string> = {
  loading: 'loading…',
  following: 'following',
  reconnecting: 'reconnecting…',
  done: 'complete',
  error: 'stopped'
};

function LogRow({ line, top }: { line: LogLine; top: number }) {
  return (
    <div
      className={`jp-mlc-log-row jp-mlc-log-${line.stream ?? 'stdout'}`}
      style={{ top }}
      title={line.ts ?? undefined}
    >
      <span className={`jp-mlc-log-rank jp-mlc-rank-color-${line.rank % 8}`}>
        [{line.rank}]
      </span>
      {line.line}
    </div>
  );
}

/**
 * A job's logs, all ranks merged (or one rank), following while the job runs. Only the
 * rows in view are in the DOM, so very long logs scroll smoothly.
 */
export function LogViewer({ job }: { job: Job }) {
  const { api, settings } = usePanel();
  const buffer = React.useMemo(
    () => new TailBuffer<LogLine>(line => line.rank, settings.logTailLines),
    // eslint-disable-next-line react-hooks/exhaustive-deps -- a new buffer for each job
    [job.id, settings.logTailLines]
  );
  const [, setVersion] = React.useState(0);
  const [status, setStatus] = React.useState<{
    state: FollowState;
    error?: string;
  }>({
    state: 'loading'
  });
  const [rank, setRank] = React.useState<number | null>(null);
  const [stick, setStick] = React.useState(true);
  const [scrollTop, setScrollTop] = React.useState(0);
  const [viewportHeight, setViewportHeight] = React.useState(240);
  const scroller = React.useRef<HTMLDivElement>(null);
  // Whether to keep following: read by the follower at each turn, so a finished job or the
  // setting turned off stops it without starting over.
  const active = React.useRef(!isFinal(job) && settings.followLogs);
  active.current = !isFinal(job) && settings.followLogs;

  React.useEffect(() => {
    const controller = new AbortController();
    let frame = 0;
    // Lines can arrive many times a frame; render at most once per frame.
    const render = () => {
      if (!frame) {
        frame = requestAnimationFrame(() => {
          frame = 0;
          setVersion(v => v + 1);
        });
      }
    };
    void followLogs(
      api,
      job.id,
      {
        append: lines => {
          buffer.append(lines);
          render();
        },
        reset: () => {
          buffer.clear();
          render();
        },
        status: (state, error) => setStatus({ state, error })
      },
      {
        isActive: () => active.current,
        signal: controller.signal
      }
    ).catch(error =>
      setStatus({ state: 'error', error: String(error?.message ?? error) })
    );
    return () => {
      controller.abort();
      cancelAnimationFrame(frame);
    };
  }, [api, job.id, buffer]);

  React.useEffect(() => {
    const el = scroller.current;
    if (!el) {
      return;
    }
    const observer = new ResizeObserver(() =>
      setViewportHeight(el.clientHeight)
    );
    observer.observe(el);
    setViewportHeight(el.clientHeight);
    return () => observer.disconnect();
  }, []);

  const lines = buffer.lines(rank);
  const count = lines.length;

  // Keep the newest line in view while following: after every render, since lines arrive in a
  // mutable buffer (one render per frame) whose count stops changing once it is full.
  // eslint-disable-next-line react-hooks/exhaustive-deps -- after every render, on purpose
  React.useLayoutEffect(() => {
    const el = scroller.current;
    if (el && stick) {
      const top = bottomScrollTop(count, LOG_ROW_HEIGHT, el.clientHeight);
      if (Math.abs(el.scrollTop - top) > 1) {
        el.scrollTop = top;
      }
      setScrollTop(el.scrollTop);
    }
  });

  // Following stops only when the user scrolls away from the end (wheel, keys, scrollbar,
  // touch), not when a resize or a theme change moves or resets the scroll position; it
  // resumes when they come back to the end.
  const userScrolledAt = React.useRef(0);
  const noteUserScroll = () => {
    userScrolledAt.current = Date.now();
  };
  const onScroll = () => {
    const el = scroller.current;
    if (el) {
      if (isAtBottom(el.scrollTop, el.clientHeight, el.scrollHeight)) {
        setStick(true);
      } else if (Date.now() - userScrolledAt.current < 1000) {
        setStick(false);
      }
      setScrollTop(el.scrollTop);
    }
  };

  const win = visibleWindow({
    count,
    rowHeight: LOG_ROW_HEIGHT,
    scrollTop,
    viewportHeight
  });
  const rows: React.ReactNode[] = [];
  for (let i = win.start; i < win.end; i++) {
    rows.push(<LogRow key={i} line={lines[i]} top={i * LOG_ROW_HEIGHT} />);
  }

  const ranks = Array.from({ length: job.workers }, (_, i) => i);
  return (
    <div className="jp-mlc-logs">
      <div className="jp-mlc-logs-head">
        <h4 className="jp-mlc-subtitle">Logs</h4>
        <span
          className={`jp-mlc-logs-status jp-mlc-logs-status-${status.state}`}
          title={status.error}
        >
          <span className="jp-mlc-state-dot" aria-hidden="true" />
          {STATUS_TEXT[status.state]}
        </span>
      </div>
      <div className="jp-mlc-logs-toolbar">
        <label>
          <span className="jp-mlc-visually-hidden">Show logs of</span>
          <select
            className="jp-mlc-select"
            value={rank === null ? 'all' : String(rank)}
            onChange={e =>
              setRank(e.target.value === 'all' ? null : Number(e.target.value))
            }
            aria-label="Show logs of rank"
          >
            <option value="all">All ranks</option>
            {ranks.map(r => (
              <option key={r} value={r}>
                Rank {r}
              </option>
            ))}
          </select>
        </label>
        <span className="jp-mlc-logs-count" aria-live="polite">
          {count.toLocaleString()} lines
          {buffer.dropped > 0 &&
            ` (oldest ${buffer.dropped.toLocaleString()} dropped)`}
        </span>
        {!stick && (
          <button
            className="jp-mlc-button jp-mlc-button-small"
            onClick={() => setStick(true)}
            aria-label="Jump to the newest log line"
          >
            ↓ Latest
          </button>
        )}
      </div>
      {status.state === 'error' && status.error && (
        <div className="jp-mlc-banner jp-mlc-banner-error" role="alert">
          Logs unavailable: {status.error}
        </div>
      )}
      <div
        className="jp-mlc-log-scroller"
        ref={scroller}
        onScroll={onScroll}
        onWheel={noteUserScroll}
        onPointerDown={noteUserScroll}
        onTouchStart={noteUserScroll}
        onKeyDown={noteUserScroll}
        tabIndex={0}
        role="log"
        aria-live="off"
        aria-label={`Logs of ${job.name}, ${count} lines`}
      >
        <div className="jp-mlc-log-canvas" style={{ height: win.totalHeight }}>
          {rows}
        </div>
        {count === 0 && status.state !== 'loading' && (
          <div className="jp-mlc-log-empty">No output yet.</div>
        )}
      </div>
    </div>
  );
}
