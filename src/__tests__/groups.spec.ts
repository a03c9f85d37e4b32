import { groupJobs, groupSummary } from '../model/groups';
import { makeJob } from './helpers';

describe('groupJobs', () => {
  const session = makeJob({
    id: 'jsession001',
    name: 'warm',
    session: { name: 'warm', id: 'jsession001', cell: false }
  });
  const cell = (n: number, state = 'succeeded') =>
    makeJob({
      id: `jcell0000${n}`,
      name: `train-cell${n}`,
      state,
      parent: 'jsession001',
      session: { name: 'warm', id: 'jsession001', cell: true }
    });
  const trial = (i: number, state = 'succeeded') =>
    makeJob({
      id: `jtrial000${i}`,
      name: `tune-cell4-t${i}`,
      state,
      parent: 's0123456789',
      sweep: { id: 's0123456789', trial: i, parallel: null, name: 'tune-cell4' }
    });

  it('puts cells under their session and trials under their sweep, where the first member comes', () => {
    const plain = makeJob({ id: 'jplain00001', name: 'eval' });
    const entries = groupJobs([
      cell(3, 'running'),
      trial(1),
      plain,
      session,
      cell(2),
      trial(0)
    ]);
    expect(entries.map(e => [e.kind, e.id])).toEqual([
      ['group', 'jsession001'],
      ['group', 's0123456789'],
      ['job', 'jplain00001']
    ]);
    const [warm, sweep] = entries as any[];
    expect(warm.head.id).toBe('jsession001');
    expect(warm.name).toBe('warm');
    expect(warm.children.map((j: any) => j.name)).toEqual([
      'train-cell3',
      'train-cell2'
    ]);
    expect(groupSummary(warm)).toBe('2 cells, 1 running');
    expect(sweep.head).toBeNull();
    expect(sweep.name).toBe('tune-cell4');
    expect(groupSummary(sweep)).toBe('2 trials');
  });

  it('keeps a session without cells a plain row, and names a sweep from its trials', () => {
    const old = makeJob({
      id: 'jtrialold01',
      name: 'sweep-t7',
      parent: 'sold0000001',
      sweep: { id: 'sold0000001', trial: 7, parallel: null }
    });
    const entries = groupJobs([session, old]);
    expect(entries.map(e => e.kind)).toEqual(['job', 'group']);
    expect((entries[1] as any).name).toBe('sweep');
  });
});
