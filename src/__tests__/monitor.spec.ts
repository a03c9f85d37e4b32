import { tensorBoardJobId } from '../model/monitor';

describe("the cell monitor's TensorBoard button", () => {
  it('names a job id, and nothing else reaches the command', () => {
    expect(tensorBoardJobId('j1a2b3c4d5')).toBe('j1a2b3c4d5');
    expect(tensorBoardJobId('train-7')).toBe('train-7');
    for (const bad of [
      null,
      undefined,
      '',
      '../jobs',
      'J1',
      'a b',
      'x'.repeat(64)
    ]) {
      expect(tensorBoardJobId(bad)).toBeNull();
    }
  });
});
