// The page: loads the wasm engine and a model, streams a generation token by token, and draws
// the sparsity pictures. Query parameters (?model=URL&prompt=…&n=…&run=1&compute=auto|webgpu|cpu)
// preload a model and start a generation, which the browser test uses (and &simd=scalar|simd128
// picks the CPU kernels, for benches/web_cpu.sh); document.body.dataset.state
// tells where the page is (starting, idle, loading, ready, generating, done, error) and
// document.body.dataset.backend which compute path ran.
//
// Compute: on WebGPU (when the browser offers an adapter and the compute choice allows it; `auto`
// passes over software adapters such as SwiftShader, slower than the CPU path) the engine's forward
// pass runs on the GPU and each token is awaited (start_async, next_token_async); on the wasm CPU
// path the calls are synchronous (start, next_token).

import init, { Engine, set_simd } from './pkg/hotcold_web.js';
import { drawDensity, drawHeatmap } from './charts.js';
import { webgpuAdapter } from './webgpu.js';

const $ = (id) => document.getElementById(id);
const pageStart = performance.now();
let engine = null;
let info = null;
let stopRequested = false;
// What the browser offers (see webgpu.js), once known.
const adapterPromise = webgpuAdapter();

function setState(state, message) {
  document.body.dataset.state = state;
  if (message !== undefined) $('model-info').textContent = message;
}

function fail(err) {
  console.error(err);
  const text = err && err.message ? err.message : String(err);
  $('model-info').innerHTML = '';
  const span = document.createElement('span');
  span.className = 'error';
  span.textContent = `Error: ${text}`;
  $('model-info').append(span);
  document.body.dataset.error = text;
  setState('error');
  $('run').disabled = engine === null;
  $('stop').disabled = true;
}

function formatBytes(n) {
  if (n >= 1 << 30) return `${(n / (1 << 30)).toFixed(2)} GiB`;
  if (n >= 1 << 20) return `${(n / (1 << 20)).toFixed(1)} MiB`;
  return `${(n / 1024).toFixed(1)} KiB`;
}

/** Reads `response`'s body, reporting progress (bytes so far, total when known). */
async function readWithProgress(response, onProgress) {
  const total = Number(response.headers.get('Content-Length')) || 0;
  const reader = response.body.getReader();
  const chunks = [];
  let received = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    received += value.length;
    onProgress(received, total);
  }
  const bytes = new Uint8Array(received);
  let offset = 0;
  for (const c of chunks) { bytes.set(c, offset); offset += c.length; }
  return bytes;
}

async function loadBytes(bytes, name) {
  setState('loading', `Parsing ${name} (${formatBytes(bytes.length)})…`);
  await new Promise((r) => setTimeout(r, 0));
  if (engine) { engine.free(); engine = null; }
  const t0 = performance.now();
  engine = new Engine(bytes, 0);
  const loadMs = performance.now() - t0;
  info = JSON.parse(engine.info());
  document.body.dataset.modelLoadMs = loadMs.toFixed(0);
  const description = `${name}: ${info.arch} (${info.format}), ${info.n_layer} layers × ${info.n_ff} FFN neurons, `
    + `vocabulary ${info.n_vocab}, context ${info.n_ctx}, ${info.has_predictor ? 'with' : 'without'} predictor; `
    + `loaded in ${loadMs.toFixed(0)} ms`;
  const note = await applyCompute();
  setState('ready', note ? `${description} (${note})` : description);
  $('run').disabled = false;
  setupBudget();
  drawPictures();
}

async function loadUrl(url) {
  try {
    setState('loading', `Fetching ${url}…`);
    const response = await fetch(url);
    if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
    const bytes = await readWithProgress(response, (got, total) => {
      $('progress').max = total || got;
      $('progress').value = got;
      $('model-info').textContent = `Fetching ${url}: ${formatBytes(got)}${total ? ` of ${formatBytes(total)}` : ''}`;
    });
    await loadBytes(bytes, url);
  } catch (e) { fail(e); }
}

async function loadFile(file) {
  try {
    setState('loading', `Reading ${file.name}…`);
    $('progress').max = file.size;
    $('progress').value = 0;
    const reader = file.stream().getReader();
    const bytes = new Uint8Array(file.size);
    let offset = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      bytes.set(value, offset);
      offset += value.length;
      $('progress').value = offset;
    }
    await loadBytes(bytes, file.name);
  } catch (e) { fail(e); }
}

/** Puts the engine on the compute path the `compute` choice asks for; returns a note when `auto`
 * fell back to the CPU. Throws when WebGPU was asked for and cannot run the model. */
async function applyCompute() {
  const choice = $('compute').value;
  const adapter = await adapterPromise;
  let note = '';
  if (choice === 'auto' && adapter.software) {
    engine.use_cpu();
    note = `WebGPU not used: ${adapter.name} is a software adapter (choose WebGPU to use it anyway)`;
  } else if (choice === 'cpu') {
    engine.use_cpu();
  } else {
    try {
      const t0 = performance.now();
      const report = JSON.parse(await engine.init_gpu());
      document.body.dataset.gpuLoadMs = (performance.now() - t0).toFixed(0);
      document.body.dataset.gpuLimits = JSON.stringify(report);
    } catch (e) {
      if (choice === 'webgpu') throw e;
      engine.use_cpu();
      note = `WebGPU not used: ${e.message || e}`;
    }
  }
  const backend = engine.backend();
  $('backend').textContent = backend;
  document.body.dataset.backend = backend;
  return note;
}

function totalFfnBytes() {
  return info.neuron_bytes.reduce((s, b) => s + b * info.n_ff, 0);
}

function setupBudget() {
  $('budget').max = 100;
  updateBudgetText();
}

function budgetBytes() {
  return (Number($('budget').value) / 100) * totalFfnBytes();
}

function updateBudgetText() {
  if (!info) return;
  $('budget-text').textContent = `${formatBytes(budgetBytes())} of ${formatBytes(totalFfnBytes())}`;
}

function drawPictures() {
  if (!engine || !info) return;
  drawDensity($('density'), engine.last_token_density(), engine.computed_density());
  const freqs = engine.firing_frequencies();
  // hotcold-core's placement planner, run here in wasm
  const split = JSON.parse(engine.hot_cold_split(budgetBytes()));
  drawHeatmap($('heatmap'), freqs, info.n_layer, info.n_ff, split.hot);
  const hotTotal = split.hot.reduce((a, b) => a + b, 0);
  const hit = split.hit_rate.reduce((a, b) => a + b, 0) / Math.max(1, split.hit_rate.length);
  $('split-text').textContent = `${hotTotal} of ${info.n_layer * info.n_ff} neurons hot `
    + `(${formatBytes(split.bytes)}); expected share of firing neurons on the GPU: ${(100 * hit).toFixed(1)}%`;
}

function showSpeed() {
  const timings = engine.timings();
  document.body.dataset.timings = timings;
  const t = JSON.parse(timings);
  $('speed').textContent = `prompt ${t.prompt_tokens} tokens in ${(t.prompt_secs * 1000).toFixed(0)} ms · `
    + `${t.generated_tokens} tokens, ${t.decode_tok_per_s.toFixed(1)} tok/s · `
    + (t.computed_density === null
      ? 'FFN statistics are gathered on the CPU path only'
      : `FFN neurons computed per token: ${(100 * t.computed_density).toFixed(1)}%`);
}

async function generate() {
  if (!engine) return;
  stopRequested = false;
  $('run').disabled = true;
  $('stop').disabled = false;
  $('output').textContent = '';
  const prompt = $('prompt').value;
  $('prompt-echo').textContent = prompt;
  setState('generating');
  try {
    const args = [prompt, Number($('max-tokens').value), Number($('temperature').value),
      Number($('seed').value) >>> 0, $('ffn').value];
    const gpu = engine.uses_gpu();
    if (gpu) await engine.start_async(...args); else engine.start(...args);
    let lastPaint = 0;
    for (;;) {
      if (stopRequested) { $('output').textContent += engine.stop(); break; }
      const text = gpu ? await engine.next_token_async() : engine.next_token();
      if (text === undefined) break;
      $('output').textContent += text;
      const now = performance.now();
      if (now - lastPaint > 50) {
        lastPaint = now;
        showSpeed();
        drawPictures();
        // Let the page paint and the Stop button be clicked.
        await new Promise((r) => setTimeout(r, 0));
      }
    }
    showSpeed();
    drawPictures();
    document.body.dataset.stop = engine.stop_reason() || '';
    setState('done');
  } catch (e) { fail(e); }
  $('run').disabled = false;
  $('stop').disabled = true;
}

async function main() {
  $('file').addEventListener('change', (e) => { if (e.target.files[0]) loadFile(e.target.files[0]); });
  $('load-url').addEventListener('click', () => loadUrl($('url').value));
  $('run').addEventListener('click', generate);
  $('stop').addEventListener('click', () => { stopRequested = true; });
  $('budget').addEventListener('input', () => { updateBudgetText(); drawPictures(); });
  $('compute').addEventListener('change', async () => {
    if (!engine || document.body.dataset.state === 'generating') return;
    try {
      const note = await applyCompute();
      if (note) $('model-info').textContent = note;
    } catch (e) { fail(e); }
  });
  adapterPromise.then(({ name, software }) => {
    const text = software ? `${name} (software)` : name;
    $('webgpu').textContent = text;
    document.body.dataset.webgpu = text;
  });
  await init();
  $('backend').textContent = 'no model loaded';
  const pageMs = performance.now() - pageStart;
  document.body.dataset.pageLoadMs = pageMs.toFixed(0);
  setState('idle');
  const params = new URLSearchParams(location.search);
  if (params.has('simd')) set_simd(params.get('simd'));
  if (params.has('prompt')) $('prompt').value = params.get('prompt');
  if (params.has('n')) $('max-tokens').value = params.get('n');
  if (params.has('ffn')) $('ffn').value = params.get('ffn');
  if (params.has('compute')) $('compute').value = params.get('compute');
  if (params.has('model')) {
    $('url').value = params.get('model');
    await loadUrl(params.get('model'));
    if (params.get('run') === '1' && engine) await generate();
  }
}

main().catch(fail);
