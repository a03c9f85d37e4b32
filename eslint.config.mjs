// ESLint for the sidebar (src/), after the JupyterLab extension template: the recommended
// JavaScript and typescript-eslint rules, prettier as a rule, and the template's house rules.
import js from '@eslint/js';
import { defineConfig } from 'eslint/config';
import prettierRecommended from 'eslint-plugin-prettier/recommended';
import reactHooks from 'eslint-plugin-react-hooks';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default defineConfig([
  {
    ignores: [
      'node_modules/**',
      'lib/**',
      'labextension/**',
      'coverage/**',
      '.venv/**',
      '**/*.js',
      '**/*.d.ts',
      // generated from the API document by scripts/api-types.mjs
      'src/model/api-types.ts'
    ]
  },
  js.configs.recommended,
  tseslint.configs.recommended,
  {
    files: ['**/*.ts', '**/*.tsx'],
    languageOptions: {
      globals: { ...globals.browser, ...globals.node },
      parserOptions: { project: 'tsconfig.eslint.json', sourceType: 'module' }
    },
    // The rules of hooks, and every value an effect or callback reads in its dependency list
    // (the React Compiler's rules in the plugin's `recommended` are not taken: no compiler here).
    plugins: { 'react-hooks': reactHooks },
    rules: {
      'react-hooks/rules-of-hooks': 'error',
      'react-hooks/exhaustive-deps': 'error',
      '@typescript-eslint/no-unused-vars': ['warn', { args: 'none' }],
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/no-namespace': 'off',
      '@typescript-eslint/no-use-before-define': 'off',
      curly: ['error', 'all'],
      eqeqeq: 'error',
      'prefer-arrow-callback': 'error'
    }
  },
  prettierRecommended
]);
