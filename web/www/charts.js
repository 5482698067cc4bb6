// The page's two pictures, drawn on canvases: per-layer density bars and the firing heatmap.

/** Bars of `fired[l]` per layer with an outline at `computed[l]` (both fractions 0..1). */
export function drawDensity(canvas, fired, computed) {
  const g = canvas.getContext('2d');
  const { width: w, height: h } = canvas;
  g.fillStyle = '#111';
  g.fillRect(0, 0, w, h);
  const n = fired.length;
  if (n === 0) return;
  const pad = 24;
  const bw = (w - pad) / n;
  g.font = '10px sans-serif';
  g.fillStyle = '#888';
  g.fillText('1.0', 2, 12);
  g.fillText('0', 2, h - 4);
  for (let l = 0; l < n; l++) {
    const x = pad + l * bw;
    const f = Math.min(1, fired[l]);
    g.fillStyle = '#f80';
    g.fillRect(x + 1, h - f * (h - 8), Math.max(1, bw - 2), f * (h - 8));
    if (computed && computed.length === n) {
      const c = Math.min(1, computed[l]);
      g.strokeStyle = '#4af';
      g.strokeRect(x + 1, h - c * (h - 8), Math.max(1, bw - 2), c * (h - 8));
    }
  }
}

/** A colour for a frequency 0..1: black through red to yellow and white. */
function heat(f) {
  const t = Math.max(0, Math.min(1, f));
  const r = Math.min(255, Math.round(t * 3 * 255));
  const gr = Math.min(255, Math.max(0, Math.round((t * 3 - 1) * 255)));
  const b = Math.min(255, Math.max(0, Math.round((t * 3 - 2) * 255)));
  return [r, gr, b];
}

/**
 * One row per layer, neurons sorted hottest first and averaged into the canvas' columns; a
 * cyan mark at each layer's hot/cold boundary (`hot[l]` neurons).
 */
export function drawHeatmap(canvas, freqs, nLayer, nFf, hot) {
  const g = canvas.getContext('2d');
  const { width: w, height: h } = canvas;
  const img = g.createImageData(w, h);
  const rowH = h / nLayer;
  for (let l = 0; l < nLayer; l++) {
    const sorted = Array.from(freqs.subarray(l * nFf, (l + 1) * nFf)).sort((a, b) => b - a);
    const y0 = Math.floor(l * rowH);
    const y1 = Math.max(y0 + 1, Math.floor((l + 1) * rowH) - (rowH > 3 ? 1 : 0));
    for (let x = 0; x < w; x++) {
      const j0 = Math.floor((x * nFf) / w);
      const j1 = Math.max(j0 + 1, Math.floor(((x + 1) * nFf) / w));
      let s = 0;
      for (let j = j0; j < j1; j++) s += sorted[j];
      const [r, gr, b] = heat(s / (j1 - j0));
      for (let y = y0; y < y1; y++) {
        const p = (y * w + x) * 4;
        img.data[p] = r; img.data[p + 1] = gr; img.data[p + 2] = b; img.data[p + 3] = 255;
      }
    }
  }
  g.putImageData(img, 0, 0);
  if (!hot) return;
  g.fillStyle = '#0cf';
  for (let l = 0; l < nLayer; l++) {
    const x = Math.round((hot[l] / nFf) * w);
    g.fillRect(Math.min(w - 2, x), Math.floor(l * rowH), 2, Math.max(1, Math.floor(rowH)));
  }
}
