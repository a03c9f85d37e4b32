/**
 * Virtual list arithmetic: which rows of a long, fixed-row-height list are on screen, so
 * a 100k-line log renders a few dozen DOM rows instead of 100k.
 */

export interface WindowInput {
  /** Rows in the list. */
  count: number;
  rowHeight: number;
  scrollTop: number;
  viewportHeight: number;
  /** Extra rows rendered above and below, so fast scrolling shows no blank band. */
  overscan?: number;
}

export interface VisibleWindow {
  /** First rendered row (inclusive). */
  start: number;
  /** Last rendered row (exclusive). */
  end: number;
  /** Where the first rendered row sits, in px from the top of the list. */
  offset: number;
  /** Height of the whole list in px (the scrollable area). */
  totalHeight: number;
}

export function visibleWindow({
  count,
  rowHeight,
  scrollTop,
  viewportHeight,
  overscan = 10
}: WindowInput): VisibleWindow {
  const totalHeight = Math.max(0, count) * rowHeight;
  if (count <= 0 || rowHeight <= 0) {
    return { start: 0, end: 0, offset: 0, totalHeight };
  }
  // The browser may report a scrollTop past the end right after the list shrank.
  const maxTop = Math.max(0, totalHeight - viewportHeight);
  const top = Math.min(Math.max(0, scrollTop), maxTop);
  const first = Math.floor(top / rowHeight);
  const shown = Math.ceil(Math.max(0, viewportHeight) / rowHeight) + 1;
  const start = Math.max(0, first - overscan);
  const end = Math.min(count, first + shown + overscan);
  return { start, end, offset: start * rowHeight, totalHeight };
}

/** Is the view scrolled to the bottom (within `slack` px)? Then new lines keep it there. */
export function isAtBottom(
  scrollTop: number,
  viewportHeight: number,
  scrollHeight: number,
  slack = 4
): boolean {
  return scrollTop + viewportHeight >= scrollHeight - slack;
}

/** scrollTop that shows the last row at the bottom of the viewport. */
export function bottomScrollTop(
  count: number,
  rowHeight: number,
  viewportHeight: number
): number {
  return Math.max(0, count * rowHeight - viewportHeight);
}

/**
 * Lines in arrival order, the last `limit` of them (up to 10% more between trims; older
 * ones dropped), with a per-key
 * view (the log viewer's rank filter) kept incrementally so filtering 100k lines never
 * rescans them.
 */
export class TailBuffer<T> {
  private all: T[] = [];
  private byKey = new Map<number, T[]>();
  private droppedCount = 0;

  constructor(
    private readonly keyOf: (item: T) => number,
    public limit: number
  ) {}

  get length(): number {
    return this.all.length;
  }

  /** How many lines were dropped to stay within the limit. */
  get dropped(): number {
    return this.droppedCount;
  }

  /** The lines (all, or those of one key), oldest first. Do not mutate. */
  lines(key: number | null = null): readonly T[] {
    return key === null ? this.all : (this.byKey.get(key) ?? []);
  }

  keys(): number[] {
    return [...this.byKey.keys()].sort((a, b) => a - b);
  }

  append(items: readonly T[]): void {
    for (const item of items) {
      this.all.push(item);
      const key = this.keyOf(item);
      let list = this.byKey.get(key);
      if (!list) {
        list = [];
        this.byKey.set(key, list);
      }
      list.push(item);
    }
    // Trim in batches (up to 10% over the limit) so appending one line at a time stays
    // O(1) amortised instead of shifting the whole array each time.
    if (this.all.length > this.limit + Math.floor(this.limit / 10)) {
      this.trim(this.all.length - this.limit);
    }
  }

  clear(): void {
    this.all = [];
    this.byKey.clear();
    this.droppedCount = 0;
  }

  private trim(n: number): void {
    const removed = this.all.splice(0, n);
    const perKey = new Map<number, number>();
    for (const item of removed) {
      const key = this.keyOf(item);
      perKey.set(key, (perKey.get(key) ?? 0) + 1);
    }
    for (const [key, k] of perKey) {
      // Order is kept per key, so a key's oldest lines are the first ones of its list.
      this.byKey.get(key)?.splice(0, k);
    }
    this.droppedCount += n;
  }
}
