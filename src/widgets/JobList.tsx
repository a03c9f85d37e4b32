import * as React from 'react';

import { CommandIds } from '../commands';
import {
  formatAge,
  formatDuration,
  idleGpuSeconds,
  jobProgress,
  rankSummary
} from '../model/format';
import { GroupEntry, groupJobs, groupSummary } from '../model/groups';
import { listMove } from '../model/navigation';
import { notebookName } from '../model/origin';
import { Job } from '../model/types';
import { usePanel } from './context';

export function StateBadge({ state }: { state: string }) {
  return (
    <span className={`jp-mlc-state jp-mlc-state-${state}`}>
      <span className="jp-mlc-state-dot" aria-hidden="true" />
      {state}
    </span>
  );
}

/** A running job flagged for idle GPUs (the server's `gpu_idle_since`), and for how long. */
export function IdleGpuBadge({ job, now }: { job: Job; now: number }) {
  const seconds = idleGpuSeconds(job, now);
  if (seconds === null) {
    return null;
  }
  return (
    <span
      className="jp-mlc-idle-gpus"
      title={`Every GPU of this job has been nearly unused for ${formatDuration(seconds)}`}
    >
      GPUs idle
    </span>
  );
}

/** What a job's row and its detail view show beside its name: idle GPUs, then the state. */
export function JobBadges({ job, now }: { job: Job; now: number }) {
  return (
    <>
      <IdleGpuBadge job={job} now={now} />
      <StateBadge state={job.state} />
    </>
  );
}

export function ProgressBar({
  value,
  label
}: {
  value: number | null;
  label: string;
}) {
  if (value === null) {
    return null;
  }
  return (
    <div
      className="jp-mlc-progress"
      role="progressbar"
      aria-label={label}
      aria-valuemin={0}
      aria-valuemax={100}
      aria-valuenow={Math.round(value * 100)}
    >
      <div
        className="jp-mlc-progress-fill"
        style={{ width: `${value * 100}%` }}
      />
    </div>
  );
}

function JobRow({
  job,
  now,
  tabbable,
  onFocus,
  group
}: {
  job: Job;
  now: number;
  /** The one row Tab stops at; arrows move between rows (a roving tab stop). */
  tabbable: boolean;
  onFocus: () => void;
  /** A session's job heading its cells: the toggle and the cells' summary. */
  group?: GroupToggle;
}) {
  const { store, commands, settings, notebookPath, showOpenNotebook } =
    usePanel();
  const ranks = rankSummary(job);
  const age = formatAge(job.created, now);
  const notebook = notebookName(job.origin);
  const open = () => {
    store.select(job.id);
    const path = settings.revealNotebook ? notebookPath?.(job.origin) : null;
    if (path) {
      showOpenNotebook?.(path);
    }
  };
  const onKeyDown = (event: React.KeyboardEvent) => {
    if (group && groupKey(event, group)) {
      return;
    }
    if (event.key === 'Enter' || event.key === ' ') {
      event.preventDefault();
      open();
    } else if (event.key === 'Delete') {
      event.preventDefault();
      void commands.execute(CommandIds.deleteJob, { id: job.id });
    }
  };
  const row = (
    <div
      className={`jp-mlc-job-row jp-mlc-job-${job.state}`}
      role="button"
      tabIndex={tabbable ? 0 : -1}
      data-job-id={job.id}
      {...(group ? { 'aria-expanded': group.expanded } : {})}
      aria-label={`Job ${job.name}: ${job.state}${idleGpuSeconds(job, now) === null ? '' : ', GPUs idle'}, ${ranks}, ${job.backend} backend${notebook ? `, from ${notebook}` : ''}, created ${age === 'just now' ? 'just now' : `${age} ago`}. Enter: details; Delete: delete.`}
      onClick={open}
      onKeyDown={onKeyDown}
      onFocus={onFocus}
    >
      <div className="jp-mlc-job-row-main">
        {group && <GroupCaret group={group} />}
        <span className="jp-mlc-job-name" title={`${job.name} (${job.id})`}>
          {job.name}
        </span>
        <JobBadges job={job} now={now} />
      </div>
      <div className="jp-mlc-job-row-meta">
        <span className="jp-mlc-job-ranks">{ranks}</span>
        {group && <span className="jp-mlc-group-summary">{group.summary}</span>}
        <span className="jp-mlc-job-backend">{job.backend}</span>
        {notebook && (
          <span
            className="jp-mlc-job-notebook"
            title={job.origin?.notebook ?? undefined}
          >
            {notebook}
          </span>
        )}
        <span className="jp-mlc-job-age" title={job.created}>
          {age}
        </span>
      </div>
      <ProgressBar value={jobProgress(job)} label={`${job.name} progress`} />
    </div>
  );
  return group ? row : <li className="jp-mlc-job-row-item">{row}</li>;
}

/** What a group's heading row needs: whether it is open, how to open it, its summary. */
interface GroupToggle {
  expanded: boolean;
  toggle: () => void;
  summary: string;
}

/** Right opens a group, Left closes it (as a tree does); true when the key was that. */
function groupKey(event: React.KeyboardEvent, group: GroupToggle): boolean {
  if (
    (event.key === 'ArrowRight' && !group.expanded) ||
    (event.key === 'ArrowLeft' && group.expanded)
  ) {
    event.preventDefault();
    event.stopPropagation();
    group.toggle();
    return true;
  }
  return false;
}

/** The caret that opens or closes a group (a click on it does not open the job). */
function GroupCaret({ group }: { group: GroupToggle }) {
  return (
    <span
      className="jp-mlc-group-toggle"
      aria-hidden="true"
      onClick={event => {
        event.stopPropagation();
        group.toggle();
      }}
    >
      {group.expanded ? '▾' : '▸'}
    </span>
  );
}

/** A sweep's heading row: its name and its trials' states; Enter opens or closes it. */
function SweepRow({
  entry,
  group,
  tabbable,
  onFocus
}: {
  entry: GroupEntry;
  group: GroupToggle;
  tabbable: boolean;
  onFocus: () => void;
}) {
  const running = entry.children.some(job => job.state === 'running');
  const onKeyDown = (event: React.KeyboardEvent) => {
    if (groupKey(event, group)) {
      return;
    }
    if (event.key === 'Enter' || event.key === ' ') {
      event.preventDefault();
      group.toggle();
    }
  };
  return (
    <div
      className={`jp-mlc-job-row jp-mlc-group-row${running ? ' jp-mlc-job-running' : ''}`}
      role="button"
      tabIndex={tabbable ? 0 : -1}
      data-job-id={entry.id}
      aria-expanded={group.expanded}
      aria-label={`Sweep ${entry.name}: ${group.summary}. Enter: ${group.expanded ? 'hide' : 'show'} its trials.`}
      onClick={group.toggle}
      onKeyDown={onKeyDown}
      onFocus={onFocus}
    >
      <div className="jp-mlc-job-row-main">
        <GroupCaret group={group} />
        <span
          className="jp-mlc-job-name"
          title={`sweep ${entry.name} (${entry.id})`}
        >
          {entry.name}
        </span>
        <span className="jp-mlc-group-kind">sweep</span>
      </div>
      <div className="jp-mlc-job-row-meta">
        <span className="jp-mlc-job-ranks">{group.summary}</span>
      </div>
    </div>
  );
}

/** A session with its cells, or a sweep with its trials: a heading row, and its members
 * under it while it is open (live: they come from the same store as every row). */
function GroupItem({
  entry,
  now,
  expanded,
  onToggle,
  tabStop,
  setFocused
}: {
  entry: GroupEntry;
  now: number;
  expanded: boolean;
  onToggle: () => void;
  tabStop: string | null;
  setFocused: (id: string) => void;
}) {
  const group: GroupToggle = {
    expanded,
    toggle: onToggle,
    summary: groupSummary(entry)
  };
  const childrenId = `jp-mlc-group-${entry.id}`;
  return (
    <li
      className={`jp-mlc-job-row-item jp-mlc-group jp-mlc-group-${entry.groupKind}`}
      data-group-id={entry.id}
    >
      {entry.head ? (
        <JobRow
          job={entry.head}
          now={now}
          tabbable={entry.id === tabStop}
          onFocus={() => setFocused(entry.id)}
          group={group}
        />
      ) : (
        <SweepRow
          entry={entry}
          group={group}
          tabbable={entry.id === tabStop}
          onFocus={() => setFocused(entry.id)}
        />
      )}
      {expanded && (
        <ul
          className="jp-mlc-group-children"
          id={childrenId}
          aria-label={`${entry.groupKind === 'sweep' ? 'Trials' : 'Cells'} of ${entry.name}`}
        >
          {entry.children.map(job => (
            <JobRow
              key={job.id}
              job={job}
              now={now}
              tabbable={job.id === tabStop}
              onFocus={() => setFocused(job.id)}
            />
          ))}
        </ul>
      )}
    </li>
  );
}

export function JobList({
  jobs,
  now,
  focusId
}: {
  jobs: Job[];
  now: number;
  /** The row to focus when the list appears (the job whose details were just left). */
  focusId?: string | null;
}) {
  const list = React.useRef<HTMLUListElement>(null);
  const [focusedId, setFocusedId] = React.useState<string | null>(
    focusId ?? null
  );
  // Which groups are open (closed at first: a morning's cells are one row).
  const entries = React.useMemo(() => groupJobs(jobs), [jobs]);
  const [expanded, setExpanded] = React.useState<Record<string, boolean>>(
    () => {
      // Back from a cell's or a trial's details: its group stays open, its row focused.
      const parent = jobs.find(job => job.id === focusId)?.parent;
      return parent ? { [parent]: true } : {};
    }
  );
  const visible = entries.flatMap(entry =>
    entry.kind === 'group' && expanded[entry.id]
      ? [entry.id, ...entry.children.map(job => job.id)]
      : [entry.id]
  );
  // Tab enters the list at the row last focused (while it shows), else at the first.
  const tabStop =
    focusedId !== null && visible.includes(focusedId)
      ? focusedId
      : (visible[0] ?? null);
  React.useEffect(() => {
    if (focusId) {
      list.current
        ?.querySelector<HTMLElement>(`[data-job-id="${CSS.escape(focusId)}"]`)
        ?.focus();
    }
  }, [focusId]);

  if (jobs.length === 0) {
    return (
      <div className="jp-mlc-empty jp-mlc-empty-jobs">
        <p>No distributed jobs yet.</p>
        <p className="jp-mlc-hint">
          Put <code>%%distributed --workers 2</code> on top of a notebook cell
          and run it: the job shows up here.
        </p>
      </div>
    );
  }

  // Arrow keys, Home and End move between rows, as in JupyterLab's file browser.
  const onKeyDown = (event: React.KeyboardEvent) => {
    const rows = Array.from(
      list.current?.querySelectorAll<HTMLElement>('.jp-mlc-job-row') ?? []
    );
    const current = rows.indexOf(document.activeElement as HTMLElement);
    const next = listMove(event.key, current, rows.length);
    if (next !== null) {
      event.preventDefault();
      rows[next].focus();
    }
  };

  return (
    <ul
      className="jp-mlc-job-list"
      aria-label="Distributed jobs"
      ref={list}
      onKeyDown={onKeyDown}
    >
      {entries.map(entry =>
        entry.kind === 'group' ? (
          <GroupItem
            key={entry.id}
            entry={entry}
            now={now}
            expanded={!!expanded[entry.id]}
            onToggle={() =>
              setExpanded(e => ({ ...e, [entry.id]: !e[entry.id] }))
            }
            tabStop={tabStop}
            setFocused={setFocusedId}
          />
        ) : (
          <JobRow
            key={entry.id}
            job={entry.job}
            now={now}
            tabbable={entry.id === tabStop}
            onFocus={() => setFocusedId(entry.id)}
          />
        )
      )}
    </ul>
  );
}
