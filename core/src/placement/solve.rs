//! The exact solver of the placement objective (see the module docs of [`crate::placement`]).

use std::collections::BTreeMap;

use super::problem::{frequency_sum, sum, Problem};
use crate::{Error, Result};

/// Most objective evaluations [`solve`] performs before refusing (seconds of work).
const MAX_EVALUATIONS: f64 = 4e9;

/// An optimal placement.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Per layer, the ids of the neurons on the GPU, ascending.
    pub hot: Vec<Vec<u32>>,
    /// Per layer, whether its dense tensors (attention, norms, predictor) are on the GPU.
    pub dense_on_gpu: Vec<bool>,
    /// Per global tensor of the problem, whether it is on the GPU.
    pub globals_on_gpu: Vec<bool>,
    /// Bytes the plan puts on the GPU (at most the budget).
    pub gpu_bytes: u64,
    /// The objective: expected bytes read per token that the GPU serves.
    pub served_bytes: f64,
}

impl Plan {
    /// Per layer, the expected share of its activated neurons that are on the GPU
    /// (`Σ_hot f / Σ_all f`; 0 for a layer whose neurons never fire).
    pub fn layer_gpu_share(&self, problem: &Problem) -> Vec<f64> {
        problem
            .layers
            .iter()
            .zip(&self.hot)
            .map(|(l, hot)| {
                let all = frequency_sum(l);
                let on_gpu = sum(hot.iter().map(|&i| f64::from(l.frequencies[i as usize])));
                if all > 0.0 {
                    on_gpu / all
                } else {
                    0.0
                }
            })
            .collect()
    }

    /// The expected share of all activated neurons (every layer) that are on the GPU.
    pub fn gpu_share(&self, problem: &Problem) -> f64 {
        let fired = sum(problem.layers.iter().map(frequency_sum));
        let served = sum(problem
            .layers
            .iter()
            .zip(self.layer_gpu_share(problem))
            .map(|(l, s)| s * frequency_sum(l)));
        if fired > 0.0 {
            served / fired
        } else {
            0.0
        }
    }

    /// Bytes of FFN neurons on the GPU.
    pub fn neuron_bytes(&self, problem: &Problem) -> u64 {
        problem
            .layers
            .iter()
            .zip(&self.hot)
            .map(|(l, h)| l.neuron_bytes * h.len() as u64)
            .sum()
    }
}

/// The neurons of all layers that share one neuron cost, most frequent first.
struct CostClass {
    cost: u64,
    /// `(layer, neuron)` in descending frequency (ties: lower layer, then lower id).
    order: Vec<(u32, u32)>,
    /// `prefix[k]`: value of the first `k` neurons of `order`.
    prefix: Vec<f64>,
}

impl CostClass {
    /// Most neurons of this class that fit in `budget` bytes.
    fn max_count(&self, budget: u64) -> usize {
        match budget.checked_div(self.cost) {
            Some(k) => self
                .order
                .len()
                .min(usize::try_from(k).unwrap_or(usize::MAX)),
            None => self.order.len(), // free neurons: all of them
        }
    }
}

/// Groups the neurons by cost and sorts each group by descending frequency.
fn cost_classes(problem: &Problem) -> Vec<CostClass> {
    let mut by_cost: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (il, l) in problem.layers.iter().enumerate() {
        if !l.frequencies.is_empty() {
            by_cost.entry(l.neuron_bytes).or_default().push(il);
        }
    }
    let mut classes: Vec<CostClass> = by_cost
        .into_iter()
        .map(|(cost, layers)| {
            // Sort keys: inverted frequency bits (frequencies are non-negative, so their bits
            // order like the values) above the neuron's position in the class.
            let n: usize = layers
                .iter()
                .map(|&il| problem.layers[il].frequencies.len())
                .sum();
            let mut keys = Vec::with_capacity(n);
            let mut start = Vec::with_capacity(layers.len());
            for &il in &layers {
                start.push(keys.len() as u64);
                let f = &problem.layers[il].frequencies;
                let base = keys.len() as u64;
                keys.extend(f.iter().enumerate().map(|(i, &x)| {
                    let bits = (x + 0.0).to_bits(); // + 0.0 turns −0 into +0
                    (u64::from(!bits) << 32) | (base + i as u64)
                }));
            }
            let keys = radix_sort_high32(keys);
            let mut order = Vec::with_capacity(keys.len());
            let mut prefix = Vec::with_capacity(keys.len() + 1);
            let mut acc = 0.0f64;
            prefix.push(acc);
            for key in keys {
                let pos = key & 0xffff_ffff;
                let slot = start.partition_point(|&s| s <= pos) - 1;
                let il = layers[slot];
                let i = (pos - start[slot]) as usize;
                acc += f64::from(problem.layers[il].frequencies[i]) * cost as f64;
                prefix.push(acc);
                order.push((il as u32, i as u32));
            }
            CostClass {
                cost,
                order,
                prefix,
            }
        })
        .collect();
    // The last class is closed-form and the others are enumerated: enumerate the small ones.
    classes.sort_by_key(|c| c.order.len());
    classes
}

/// Sorts `keys` by their high 32 bits, keeping the order of equal ones (LSD radix sort, two
/// passes of 16 bits: linear time, so a 40B model's two million neurons sort in milliseconds).
fn radix_sort_high32(mut keys: Vec<u64>) -> Vec<u64> {
    let mut out = vec![0u64; keys.len()];
    for shift in [32, 48] {
        let digit = |k: u64| ((k >> shift) & 0xffff) as usize;
        let mut start = vec![0usize; 1 << 16];
        for &k in &keys {
            start[digit(k)] += 1;
        }
        let mut acc = 0;
        for s in &mut start {
            (*s, acc) = (acc, acc + *s);
        }
        for &k in &keys {
            let d = digit(k);
            out[start[d]] = k;
            start[d] += 1;
        }
        std::mem::swap(&mut keys, &mut out);
    }
    keys
}

/// The best value of the neurons within `budget`, and the count taken from each class.
fn best_neurons(classes: &[CostClass], budget: u64) -> (f64, Vec<usize>) {
    match classes {
        [] => (0.0, Vec::new()),
        [last] => {
            let k = last.max_count(budget);
            (last.prefix[k], vec![k])
        }
        [first, rest @ ..] => {
            let mut best: Option<(f64, usize)> = None;
            for k in 0..=first.max_count(budget) {
                let v = first.prefix[k] + best_value(rest, budget - k as u64 * first.cost);
                if best.is_none_or(|(bv, _)| v >= bv) {
                    best = Some((v, k));
                }
            }
            let (v, k) = best.expect("k = 0 always fits");
            let (_, mut counts) = best_neurons(rest, budget - k as u64 * first.cost);
            counts.insert(0, k);
            (v, counts)
        }
    }
}

/// [`best_neurons`]' value alone (no allocation: it runs in the enumeration's inner loop).
fn best_value(classes: &[CostClass], budget: u64) -> f64 {
    match classes {
        [] => 0.0,
        [last] => last.prefix[last.max_count(budget)],
        [first, rest @ ..] => (0..=first.max_count(budget))
            .map(|k| first.prefix[k] + best_value(rest, budget - k as u64 * first.cost))
            .fold(f64::NEG_INFINITY, f64::max),
    }
}

/// An optimal plan for `problem` (see the module docs for the objective).
pub fn solve(problem: &Problem) -> Result<Plan> {
    problem.validate()?;
    let n_layer = problem.layers.len();
    let classes = cost_classes(problem);
    // suffix[m]: bytes of the dense tensors of the last m layers.
    let mut suffix = vec![0u64; n_layer + 1];
    for m in 1..=n_layer {
        suffix[m] = suffix[m - 1] + problem.layers[n_layer - m].dense_bytes;
    }
    let n_globals = problem.globals.len();
    let choices = (n_layer as f64 + 1.0) * f64::from(1u32 << n_globals);
    let per_choice: f64 = classes[..classes.len().saturating_sub(1)]
        .iter()
        .map(|c| c.order.len() as f64 + 1.0)
        .product();
    if choices * per_choice > MAX_EVALUATIONS {
        return Err(Error::InvalidArgument(format!(
            "{} neuron-cost classes (layers whose FFN types differ) make an exact plan take \
             {:.1e} evaluations, over the limit of {MAX_EVALUATIONS:.0e}",
            classes.len(),
            choices * per_choice
        )));
    }
    // (value, dense bytes, globals mask, m, neuron budget)
    let mut best: Option<(f64, u64, u32, usize, u64)> = None;
    for mask in 0..(1u32 << n_globals) {
        let chosen = problem
            .globals
            .iter()
            .enumerate()
            .filter(|(g, _)| mask & (1 << g) != 0);
        let (g_bytes, g_value) = chosen.fold((0u64, 0.0f64), |(b, v), (_, g)| {
            (b + g.bytes, v + g.read_bytes as f64)
        });
        for (m, &dense) in suffix.iter().enumerate() {
            let Some(left) = problem.budget.checked_sub(g_bytes + dense) else {
                continue;
            };
            let v = g_value + dense as f64 + best_value(&classes, left);
            let used = g_bytes + dense;
            if best.is_none_or(|(bv, bu, ..)| v > bv || (v == bv && used > bu)) {
                best = Some((v, used, mask, m, left));
            }
        }
    }
    let mut plan = Plan {
        hot: vec![Vec::new(); n_layer],
        dense_on_gpu: vec![false; n_layer],
        globals_on_gpu: vec![false; n_globals],
        gpu_bytes: 0,
        served_bytes: 0.0,
    };
    let Some((value, _, mask, m, left)) = best else {
        return Ok(plan); // unreachable: the empty choice (m = 0, no globals) always fits
    };
    let (_, counts) = best_neurons(&classes, left);
    for (class, &k) in classes.iter().zip(&counts) {
        for &(il, i) in &class.order[..k] {
            plan.hot[il as usize].push(i);
        }
        plan.gpu_bytes += k as u64 * class.cost;
    }
    for hot in &mut plan.hot {
        hot.sort_unstable();
    }
    for (g, on) in plan.globals_on_gpu.iter_mut().enumerate() {
        *on = mask & (1 << g) != 0;
        if *on {
            plan.gpu_bytes += problem.globals[g].bytes;
        }
    }
    for il in n_layer - m..n_layer {
        plan.dense_on_gpu[il] = true;
    }
    plan.gpu_bytes += suffix[m];
    plan.served_bytes = value;
    Ok(plan)
}
