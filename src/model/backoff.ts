/** Reconnect delays: exponential, capped, with jitter so many tabs don't retry in step. */

export interface BackoffOptions {
  /** First delay in ms. */
  initial: number;
  /** Longest delay in ms. */
  max: number;
  /** Fraction of the delay randomised either way (0.2 = +-20%). */
  jitter: number;
}

export const DEFAULT_BACKOFF: BackoffOptions = {
  initial: 500,
  max: 15000,
  jitter: 0.2
};

/** Delay before retry number `attempt` (0 = the first retry). */
export function backoffDelay(
  attempt: number,
  options: BackoffOptions = DEFAULT_BACKOFF,
  random: () => number = Math.random
): number {
  const base = Math.min(
    options.max,
    options.initial * 2 ** Math.max(0, attempt)
  );
  const spread = base * options.jitter * (2 * random() - 1);
  return Math.max(0, Math.round(Math.min(options.max, base + spread)));
}

/** A promise that resolves after `ms`, or at once when `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise(resolve => {
    if (signal?.aborted) {
      resolve();
      return;
    }
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    }
    signal?.addEventListener('abort', done);
  });
}
