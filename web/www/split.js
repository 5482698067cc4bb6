// Hot/cold split of FFN neurons for a VRAM budget, computed here from the firing frequencies
// until hotcold-core's placement module is available to the page. Objective: the expected number
// of firing neurons served by the GPU. Neurons go to the GPU in order of firing frequency per byte
// (the greedy knapsack order), each one that still fits the budget; within a layer every neuron
// costs the same, so a layer's hot set is always its hottest neurons.

/**
 * @param {Float32Array} freqs n_layer × n_ff firing frequencies
 * @param {number} nLayer
 * @param {number} nFf
 * @param {number[]} neuronBytes bytes of one neuron's FFN weights, per layer
 * @param {number} budget bytes available on the GPU
 * @returns {{hot: number[], hitRate: number[], bytes: number}} hot neurons per layer, the
 *   fraction of each layer's activations served by hot neurons, bytes placed
 */
export function hotColdSplit(freqs, nLayer, nFf, neuronBytes, budget) {
  const order = Array.from({ length: nLayer * nFf }, (_, i) => i);
  const value = (i) => freqs[i] / neuronBytes[Math.floor(i / nFf)];
  order.sort((a, b) => value(b) - value(a) || a - b);
  const hot = new Array(nLayer).fill(0);
  const hotMass = new Array(nLayer).fill(0);
  let bytes = 0;
  for (const i of order) {
    const layer = Math.floor(i / nFf);
    if (bytes + neuronBytes[layer] > budget) continue;
    bytes += neuronBytes[layer];
    hot[layer] += 1;
    hotMass[layer] += freqs[i];
  }
  const hitRate = hot.map((_, l) => {
    let mass = 0;
    for (let j = 0; j < nFf; j++) mass += freqs[l * nFf + j];
    return mass > 0 ? hotMass[l] / mass : 0;
  });
  return { hot, hitRate, bytes };
}
