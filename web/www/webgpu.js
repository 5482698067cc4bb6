// WebGPU detection: what the browser offers, before the engine opens its own device on it (through
// wgpu, Engine.init_gpu).

/** The WebGPU adapter the browser gives: `{name, software}`; name "none" (with the reason) when
 * there is none. `software` marks a CPU fallback (SwiftShader), slower than the wasm CPU path. */
export async function webgpuAdapter() {
  if (!('gpu' in navigator)) return { name: 'none', software: false };
  try {
    const adapter = await navigator.gpu.requestAdapter();
    if (!adapter) return { name: 'none', software: false };
    const i = adapter.info || {};
    const name = [i.vendor, i.architecture, i.device, i.description].filter((s) => s).join(' ');
    const software = Boolean(i.isFallbackAdapter) || /swiftshader/i.test(name);
    return { name: name || 'unnamed adapter', software };
  } catch (e) {
    return { name: `none (${e.message || e})`, software: false };
  }
}
