// Runs a wasm32-wasip1 program (a test binary from `cargo test --target wasm32-wasip1`) in Node's
// WASI, passing the arguments after the module and exiting with its status. Cargo calls it as the
// target's runner (see scripts/test-wasm-simd.sh).
import { readFile } from 'node:fs/promises';
import { argv, env, exit } from 'node:process';
import { WASI } from 'node:wasi';

const [module, ...args] = argv.slice(2);
if (!module) {
  console.error('usage: node scripts/wasi-run.mjs MODULE.wasm [ARGS…]');
  exit(2);
}
const wasi = new WASI({ version: "preview1", args: [module, ...args], env, returnOnExit: true });
const wasm = await WebAssembly.compile(await readFile(module));
const instance = await WebAssembly.instantiate(wasm, { wasi_snapshot_preview1: wasi.wasiImport });
exit(wasi.start(instance));
