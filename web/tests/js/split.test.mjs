// The page's hot/cold split (web/www/split.js), checked by hand on small cases: run with
// `node --test web/tests/js/` (Node's built-in runner, no packages).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { hotColdSplit } from '../../www/split.js';

// Two layers of four neurons; layer 1's neurons cost twice layer 0's.
const freqs = new Float32Array([0.9, 0.1, 0.5, 0.0, 0.8, 0.6, 0.0, 0.2]);
const bytes = [10, 20];

test('neurons go hot by frequency per byte, each one that still fits', () => {
  // Per byte: L0 0.09, 0.05; L1 0.04 (40 B so far); L1's 0.03 would make 60 > 55, skipped;
  // L0's 0.01 (0.1 / 10, before L1's equal 0.2 / 20 by index) makes 50; nothing else fits.
  const s = hotColdSplit(freqs, 2, 4, bytes, 55);
  assert.deepEqual(s.hot, [3, 1]);
  assert.equal(s.bytes, 50);
  assert.ok(Math.abs(s.hitRate[0] - 1.5 / 1.5) < 1e-6);
  assert.ok(Math.abs(s.hitRate[1] - 0.8 / 1.6) < 1e-6);
});

test('no budget places nothing; a large one places everything', () => {
  assert.deepEqual(hotColdSplit(freqs, 2, 4, bytes, 0).hot, [0, 0]);
  const all = hotColdSplit(freqs, 2, 4, bytes, 1000);
  assert.deepEqual(all.hot, [4, 4]);
  assert.equal(all.bytes, 120);
  assert.deepEqual(all.hitRate, [1, 1]);
});

test('a layer that never fired has a hit rate of 0', () => {
  const s = hotColdSplit(new Float32Array(4), 1, 4, [1], 2);
  assert.deepEqual(s.hitRate, [0]);
});
