// WebGPU detection. The engine's GPU path (hotcold-core's wgpu module) is not wired into the page
// yet; this reports what the browser offers so that the page can choose it once it is.

/** The name of the WebGPU adapter the browser gives, or "none". */
export async function webgpuAdapterName() {
  if (!('gpu' in navigator)) return 'none';
  try {
    const adapter = await navigator.gpu.requestAdapter();
    if (!adapter) return 'none';
    const i = adapter.info || {};
    const name = [i.vendor, i.architecture, i.device, i.description].filter((s) => s).join(' ');
    return name || 'unnamed adapter';
  } catch (e) {
    return `none (${e.message || e})`;
  }
}
