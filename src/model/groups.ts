/**
 * The job list grouped (issue 35): a session's cells under the session's job, a sweep's
 * trials under the sweep, by each job's `parent` (the server's jobs/grouping.py). Pure.
 */
import { Job } from './types';

export interface JobEntry {
  kind: 'job';
  id: string;
  job: Job;
}

export interface GroupEntry {
  kind: 'group';
  /** The session's job id, or the sweep's id. */
  id: string;
  groupKind: 'session' | 'sweep';
  name: string;
  /** The session's own job (a sweep has none, nor a session whose job is gone). */
  head: Job | null;
  children: Job[];
}

export type ListEntry = JobEntry | GroupEntry;

/** The sweep's name: kept with each trial, else its trials' names less `-t<i>`. */
function sweepName(job: Job): string {
  return job.sweep?.name ?? job.name.replace(/-t\d+$/, '');
}

/**
 * `jobs` (already in display order) as the list's entries: each group where its first
 * member (its head or a child) comes, its children in the same order.
 */
export function groupJobs(jobs: Job[]): ListEntry[] {
  const byId = new Map(jobs.map(job => [job.id, job]));
  const groups = new Map<string, GroupEntry>();
  const childrenOf = (id: string): GroupEntry | undefined => groups.get(id);
  for (const job of jobs) {
    const parent = job.parent ?? null;
    if (parent === null || groups.has(parent)) {
      continue;
    }
    const head = byId.get(parent) ?? null;
    groups.set(parent, {
      kind: 'group',
      id: parent,
      groupKind: job.sweep ? 'sweep' : 'session',
      name: head?.name ?? job.session?.name ?? sweepName(job),
      head,
      children: []
    });
  }
  const entries: ListEntry[] = [];
  const placed = new Set<string>();
  for (const job of jobs) {
    const group = childrenOf(job.parent ?? '') ?? childrenOf(job.id);
    if (!group) {
      entries.push({ kind: 'job', id: job.id, job });
      continue;
    }
    if (job.id !== group.id) {
      group.children.push(job);
    }
    if (!placed.has(group.id)) {
      placed.add(group.id);
      entries.push(group);
    }
  }
  return entries;
}

/**
 * '12 cells, 1 running, 2 failed': how many, and those not (yet) succeeded by state, in the
 * order they first come (succeeded ones are the rest: the narrow sidebar has no room).
 */
export function groupSummary(group: GroupEntry): string {
  const counts = new Map<string, number>();
  for (const child of group.children) {
    if (child.state !== 'succeeded') {
      counts.set(child.state, (counts.get(child.state) ?? 0) + 1);
    }
  }
  const noun = group.groupKind === 'sweep' ? 'trial' : 'cell';
  const total = group.children.length;
  const states = Array.from(counts, ([state, n]) => `, ${n} ${state}`).join('');
  return `${total} ${noun}${total === 1 ? '' : 's'}${states}`;
}
