import { listMove } from '../model/navigation';

describe('moving through the job list with the keyboard', () => {
  it('steps with the arrows and stops at the ends', () => {
    expect(listMove('ArrowDown', 0, 3)).toBe(1);
    expect(listMove('ArrowDown', 2, 3)).toBe(2);
    expect(listMove('ArrowUp', 1, 3)).toBe(0);
    expect(listMove('ArrowUp', 0, 3)).toBe(0);
  });

  it('jumps with Home and End', () => {
    expect(listMove('Home', 2, 3)).toBe(0);
    expect(listMove('End', 0, 3)).toBe(2);
  });

  it('enters the list from outside it at the nearest end', () => {
    expect(listMove('ArrowDown', -1, 3)).toBe(0);
    expect(listMove('ArrowUp', -1, 3)).toBe(2);
  });

  it('leaves other keys and empty lists alone', () => {
    expect(listMove('Enter', 1, 3)).toBeNull();
    expect(listMove('a', 1, 3)).toBeNull();
    expect(listMove('ArrowDown', -1, 0)).toBeNull();
  });
});
