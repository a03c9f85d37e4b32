/**
 * Unit tests of the data layer (src/model): pure TypeScript run on Node, plus real local
 * HTTP and websocket servers for the API client, log follower and event stream.
 */
module.exports = {
  testEnvironment: 'node',
  roots: ['<rootDir>/src'],
  testRegex: 'src/__tests__/.*\\.spec\\.ts$',
  transform: {
    '^.+\\.tsx?$': ['ts-jest', { tsconfig: 'tsconfig.test.json' }]
  },
  collectCoverageFrom: ['src/model/**/*.ts'],
  coverageReporters: ['text-summary', 'lcov'],
  testTimeout: 20000
  // Type-checking happens once in `jlpm test` (tsc -p tsconfig.test.json), not per file here.
};
