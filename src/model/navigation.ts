/** Moving through a list with the keyboard, as in a listbox or a file browser. Pure. */

/**
 * The index focus moves to when `key` is pressed on item `current` (-1: none) of `count`
 * items, or null when the key does not move focus.
 */
export function listMove(
  key: string,
  current: number,
  count: number
): number | null {
  if (count <= 0) {
    return null;
  }
  switch (key) {
    case 'ArrowDown':
      return current < 0 ? 0 : Math.min(current + 1, count - 1);
    case 'ArrowUp':
      return current < 0 ? count - 1 : Math.max(current - 1, 0);
    case 'Home':
      return 0;
    case 'End':
      return count - 1;
    default:
      return null;
  }
}
