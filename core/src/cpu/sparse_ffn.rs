//! One token's predicted sparse FFN in a single parallel region: PowerInfer's predictor
//! (`fc2 · relu(fc1 · x)`), the choice of the neurons whose logit reaches the threshold, the gate
//! and up rows of the chosen neurons, their activations, the rounding of those activations for the
//! down projection, and the down projection itself, all in one task per thread.
//!
//! The separate steps (two [`matmul`](super::matmul)s, a selection, a
//! [`gather_matmul`](super::gather_matmul) of gate and of up, a rounding, a
//! [`sparse_axpy`](super::sparse_axpy)) are six parallel regions with a thread wake-up and a join
//! each; a layer of a small model is tens of microseconds, so those dominate. Here each task
//! computes the predictor's small hidden layer itself (a few KiB of weights) and then walks its
//! own spans of neurons, so nothing waits for anything; the down projection's terms are summed in
//! fixed bands of spans (whole rows read once, by the task that computed their activations), and
//! the bands added in order at the end. Every value is computed by the same kernels on the same
//! quantised inputs as the separate steps, so the result is bit-identical to them and does not
//! depend on the thread count.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

use super::act::{ActKind, Acts};
use super::interleaved::Interleaved;
use super::sparse::gather_rows_serial;
use super::{kind_for, offset_shift, round_with, rounding_block, Level, Matrix, OutPtr};
use crate::quant::GgmlType;
use crate::{Error, Result};

/// Neurons per span at least: spans are also whole rounding blocks of the down projection's input
/// (so that rounding a span on its own rounds it as the whole row would be rounded) and whole
/// 16-row groups of the interleaved copies. Small spans, dealt to the tasks in turn, share the
/// hottest neurons (the first rows, in a model ordered hottest first) among the tasks.
const MIN_SPAN: usize = 64;

/// The down projection's partial sums: span `s` belongs to band `s % BANDS`, each band sums its
/// neurons' terms on its own, and the bands are added in order, so the result does not depend on
/// which task ran which band (nor on the thread count). Tasks take whole bands.
const BANDS: usize = 8;

/// The neurons per span for a down projection rounding its input in blocks of `block`.
fn span_for(block: Option<usize>) -> usize {
    MIN_SPAN.max(block.unwrap_or(1))
}

/// The weights of one layer's predicted sparse FFN (an FFN with gate, without biases).
#[derive(Clone, Copy, Debug)]
pub struct PredictedFfn<'a> {
    /// The predictor's first layer: `R` rows of `n_embd`.
    pub fc1: Matrix<'a>,
    /// The predictor's second layer: `n_ff` rows of `R`.
    pub fc2: Matrix<'a>,
    /// fc1's 16-row interleaved copy, when it has one ([`Interleaved`]): the hidden layer then
    /// comes from it, as [`Interleaved::matmul`] computes it.
    pub fc1_interleaved: Option<&'a Interleaved>,
    /// fc2's interleaved copy, when it has one: the logits then come from it.
    pub fc2_interleaved: Option<&'a Interleaved>,
    /// `ffn_gate`: `n_ff` rows of `n_embd`.
    pub gate: Matrix<'a>,
    /// `ffn_up`: `n_ff` rows of `n_embd`.
    pub up: Matrix<'a>,
    /// The first rows of gate and up in the 16-row interleaved layout ([`Interleaved`], both of
    /// the same length): the neurons that fire most often, in a model ordered hottest first. A
    /// span's rows among them are computed all together (the chosen ones kept), as
    /// [`Interleaved::matmul`] computes them; the other chosen rows are gathered.
    pub hot: Option<(&'a Interleaved, &'a Interleaved)>,
    /// A neuron is chosen when its predicted logit is at least this.
    pub threshold: f32,
    /// Whether a neuron whose gate product is not positive is zero whatever its up product
    /// (ReLU, dReLU): the activation of such a chosen neuron is then `combine(gate, 0)`, and its
    /// up row is not read (a false positive of the predictor costs one row, not two).
    pub gate_decides: bool,
    /// The down projection's weight type: the activations are rounded as a product with it rounds
    /// its input ([`round_like_matmul_input`](super::round_like_matmul_input)).
    pub down_ty: GgmlType,
}

/// Per-task buffers, reused across calls.
#[derive(Default)]
struct Scratch {
    hidden: Vec<f32>,
    hidden_acts: Acts,
    logits: Vec<f32>,
    chosen: Vec<u32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    up_rows: Vec<u32>,
    up_at: Vec<u32>,
    up_firing: Vec<f32>,
    hot_gate: Vec<f32>,
    hot_up: Vec<f32>,
    round: Acts,
    spans: Vec<usize>,
    band_rows: Vec<u32>,
    band_coefs: Vec<f32>,
}

thread_local! {
    /// The caller's down-projection partial sums, one row per band.
    static PARTIALS: Cell<Option<Vec<f32>>> = const { Cell::new(None) };
    /// Each worker's [`Scratch`] (taken out during a task, so a nested call just allocates).
    static SCRATCH: Cell<Option<Box<Scratch>>> = const { Cell::new(None) };
    /// The caller's quantised inputs (x for fc1, h for gate and for up).
    static INPUTS: Cell<Option<Box<[Acts; 3]>>> = const { Cell::new(None) };
}

/// The activations `a` (`n_ff` values) of one token's FFN: for each neuron `i` with
/// `(fc2 · relu(fc1 · x))[i] >= threshold`, `a[i] = combine(gate_i · h, up_i · h)` rounded like the
/// down projection's input; `0` for the others. `x` is the predictor's input and `h` the FFN's
/// (both `n_embd` values). With `down = (w_t, y)` (the neuron-major down projection, `n_ff` rows
/// of `y.len()`), also `y = Σ_i a[i] · w_t[i]`. Returns the number of chosen neurons.
///
/// Bit-identical to [`matmul`](super::matmul) of fc1, relu, `matmul` of fc2 (or
/// [`Interleaved::matmul`] of its copy), the selection,
/// [`gather_matmul`](super::gather_matmul) of gate and up over the chosen rows (or the hot rows'
/// interleaved product), `combine` and
/// [`round_like_matmul_input`](super::round_like_matmul_input); `y` to the sum over the bands
/// (in order) of [`sparse_axpy`](super::sparse_axpy) over each band's activations alone. The same
/// bits at every thread count. Runs as one parallel region on the current rayon pool.
///
/// Errors: [`Error::InvalidArgument`] for malformed or mismatched matrices or wrong lengths;
/// [`Error::UnsupportedType`] for a weight type without kernels.
pub fn predicted_activations(
    f: &PredictedFfn,
    combine: impl Fn(f32, f32) -> f32 + Sync,
    x: &[f32],
    h: &[f32],
    a: &mut [f32],
    down: Option<(&Matrix, &mut [f32])>,
) -> Result<usize> {
    let kinds = check(f, x, h, a)?;
    let n_ff = a.len();
    if let Some((w_t, y)) = &down {
        w_t.validate()?;
        if w_t.rows != n_ff || w_t.ty != f.down_ty || y.len() != w_t.cols {
            return Err(Error::InvalidArgument(format!(
                "down projection {} {}×{} and its output ({} values) do not fit {n_ff} {} neurons",
                w_t.ty,
                w_t.rows,
                w_t.cols,
                y.len(),
                f.down_ty
            )));
        }
    }
    let level = Level::current();
    let mut inputs = INPUTS.with(|c| c.take()).unwrap_or_default();
    for (acts, (m, v)) in inputs
        .iter_mut()
        .zip([(&f.fc1, x), (&f.gate, h), (&f.up, h)])
    {
        let kind = kind_for(m.ty).expect("checked");
        acts.quantize(level, kind, offset_shift(m.ty), v, 1, m.cols);
    }
    let chosen = AtomicUsize::new(0);
    let out = OutPtr(a.as_mut_ptr());
    let spans = n_ff.div_ceil(span_for(kinds.1));
    let tasks = rayon::current_num_threads().clamp(1, spans.min(BANDS));
    let n_out = down.as_ref().map_or(0, |(w_t, _)| w_t.cols);
    let mut partials = PARTIALS.with(|c| c.take()).unwrap_or_default();
    partials.resize(BANDS * n_out, 0.0);
    let partials_out = OutPtr(partials.as_mut_ptr());
    let down_t = down.as_ref().map(|(w_t, _)| w_t);
    let task = |k: usize| {
        // the wrappers whole (a closure would capture their raw pointer fields alone)
        let (out, partials_out) = (out, partials_out);
        let mut s = SCRATCH.with(|c| c.take()).unwrap_or_default();
        hidden(f, level, &inputs[0], &mut s);
        s.spans.clear();
        s.spans
            .extend((0..spans).filter(|sp| sp % BANDS % tasks == k));
        let n = task_activations(f, level, &inputs, &combine, kinds, out, &mut s);
        chosen.fetch_add(n, Ordering::Relaxed);
        if let Some(w_t) = down_t {
            for band in (k..BANDS).step_by(tasks) {
                // SAFETY: `partials` holds BANDS × n_out values, and band `band` is this task's
                // alone.
                let y = unsafe {
                    std::slice::from_raw_parts_mut(partials_out.0.add(band * n_out), n_out)
                };
                band_down(w_t, level, kinds.1, band, out, &mut s, y);
            }
        }
        SCRATCH.with(|c| c.set(Some(s)));
    };
    if tasks == 1 {
        task(0);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
    if let Some((_, y)) = down.filter(|_| n_out > 0) {
        y.copy_from_slice(&partials[..n_out]);
        for band in partials.chunks_exact(n_out).skip(1) {
            y.iter_mut().zip(band).for_each(|(y, p)| *y += p);
        }
    }
    PARTIALS.with(|c| c.set(Some(partials)));
    INPUTS.with(|c| c.set(Some(inputs)));
    Ok(chosen.into_inner())
}

/// The up product a neuron combines with its gate product `g`: `u`, or 0 where the gate decides
/// ([`PredictedFfn::gate_decides`]) and `g` is not positive (its up row was not read).
fn gated_up(gate_decides: bool, g: f32, u: f32) -> f32 {
    let fires = g > 0.0;
    if gate_decides && !fires {
        0.0
    } else {
        u
    }
}

/// Band `band`'s partial sum of the down projection: `y = Σ a[i] · w_t[i]` over the non-zero
/// activations (at `a`, `w_t.rows` values) of the band's spans, in neuron order. The band's spans
/// must belong to the calling task, which has written them.
fn band_down(
    w_t: &Matrix,
    level: Level,
    block: Option<usize>,
    band: usize,
    a: OutPtr,
    s: &mut Scratch,
    y: &mut [f32],
) {
    let (span, n_ff) = (span_for(block), w_t.rows);
    s.band_rows.clear();
    s.band_coefs.clear();
    for sp in (band..n_ff.div_ceil(span)).step_by(BANDS) {
        let r = sp * span..((sp + 1) * span).min(n_ff);
        // SAFETY: `a` holds n_ff values, and this span is the caller's alone (no one else writes
        // it while this slice lives).
        let a = unsafe { std::slice::from_raw_parts(a.0.add(r.start) as *const f32, r.len()) };
        for (i, &v) in a.iter().enumerate() {
            if v != 0.0 {
                s.band_rows.push((r.start + i) as u32);
                s.band_coefs.push(v);
            }
        }
    }
    y.fill(0.0);
    super::sparse::axpy_rows_serial(level, w_t, &s.band_rows, &s.band_coefs, y);
}

/// Checks the shapes and types; returns the down projection's activation kind and rounding block.
fn check(f: &PredictedFfn, x: &[f32], h: &[f32], a: &[f32]) -> Result<(ActKind, Option<usize>)> {
    for m in [&f.fc1, &f.fc2, &f.gate, &f.up] {
        m.validate()?;
        kind_for(m.ty).ok_or(Error::UnsupportedType {
            ty: m.ty.name(),
            op: "predicted_activations",
        })?;
    }
    let down = kind_for(f.down_ty).ok_or(Error::UnsupportedType {
        ty: f.down_ty.name(),
        op: "predicted_activations",
    })?;
    let n_ff = a.len();
    let shapes_agree = f.fc2.cols == f.fc1.rows
        && f.fc2.rows == n_ff
        && f.gate.rows == n_ff
        && f.up.rows == n_ff
        && f.up.cols == f.gate.cols
        && x.len() == f.fc1.cols
        && h.len() == f.gate.cols;
    if !shapes_agree {
        return Err(Error::InvalidArgument(format!(
            "predicted FFN shapes disagree: fc1 {}×{}, fc2 {}×{}, gate {}×{}, up {}×{}, x {}, h {}, a {}",
            f.fc1.rows,
            f.fc1.cols,
            f.fc2.rows,
            f.fc2.cols,
            f.gate.rows,
            f.gate.cols,
            f.up.rows,
            f.up.cols,
            x.len(),
            h.len(),
            n_ff
        )));
    }
    let copy_fits = |il: &Interleaved, w: &Matrix, rows_ok: bool| {
        rows_ok && il.cols() == w.cols && il.ty() == w.ty
    };
    for (il, w, name) in [
        (f.fc1_interleaved, &f.fc1, "fc1"),
        (f.fc2_interleaved, &f.fc2, "fc2"),
    ] {
        if let Some(il) = il {
            if !copy_fits(il, w, il.rows() == w.rows) {
                return Err(Error::InvalidArgument(format!(
                    "{name}'s interleaved copy is {} {}×{}, {name} {} {}×{}",
                    il.ty(),
                    il.rows(),
                    il.cols(),
                    w.ty,
                    w.rows,
                    w.cols
                )));
            }
        }
    }
    if let Some((gate, up)) = f.hot {
        let n = gate.rows();
        let rows_ok =
            up.rows() == n && n <= n_ff && (n.is_multiple_of(Interleaved::GROUP_ROWS) || n == n_ff);
        if !copy_fits(gate, &f.gate, rows_ok) || !copy_fits(up, &f.up, rows_ok) {
            return Err(Error::InvalidArgument(format!(
                "hot rows: interleaved gate {} {}×{} and up {} {}×{} do not fit gate {} and up {} {}×{}",
                gate.ty(),
                n,
                gate.cols(),
                up.ty(),
                up.rows(),
                up.cols(),
                f.gate.ty,
                f.up.ty,
                n_ff,
                f.gate.cols
            )));
        }
    }
    let block = rounding_block(down);
    if let Some(b) = block {
        if !n_ff.is_multiple_of(b) {
            return Err(Error::InvalidArgument(format!(
                "{n_ff} neurons are not a whole number of {b}-value blocks of {}",
                f.down_ty
            )));
        }
    }
    Ok((down, block))
}

/// `relu(fc1 · x)` into `s.hidden`, quantised for fc2 into `s.hidden_acts`.
fn hidden(f: &PredictedFfn, level: Level, x: &Acts, s: &mut Scratch) {
    let r = f.fc1.rows;
    s.hidden.clear();
    s.hidden.resize(r, 0.0);
    match f.fc1_interleaved {
        Some(il) => il.run_rows(level, x, 0, r, &mut s.hidden),
        None => {
            s.chosen.clear();
            s.chosen.extend(0..r as u32);
            gather_rows_serial(level, &f.fc1, &s.chosen, x, 1, &mut s.hidden);
        }
    }
    s.hidden.iter_mut().for_each(|v| *v = v.max(0.0));
    let kind = kind_for(f.fc2.ty).expect("checked");
    s.hidden_acts
        .quantize(level, kind, offset_shift(f.fc2.ty), &s.hidden, 1, r);
}

/// The activations of a task's spans (`s.spans`, ascending) of `a` (at `out`, `n_ff` values).
/// Each step runs over all the task's spans at once (the predictor's rows, then the hot rows,
/// then the chosen cold gate rows, then the up rows), so the rows stream with prefetch as in the
/// separate operators. Returns the number of chosen neurons.
fn task_activations(
    f: &PredictedFfn,
    level: Level,
    inputs: &[Acts; 3],
    combine: &impl Fn(f32, f32) -> f32,
    (down_kind, block): (ActKind, Option<usize>),
    out: OutPtr,
    s: &mut Scratch,
) -> usize {
    let n_ff = f.gate.rows;
    let span = span_for(block);
    let spans = std::mem::take(&mut s.spans);
    let span_range = |i: usize| i * span..((i + 1) * span).min(n_ff);
    // the predictor's logits of the task's neurons, and the chosen ones (ascending)
    s.chosen.clear();
    for &i in &spans {
        s.chosen.extend(span_range(i).map(|r| r as u32));
    }
    s.logits.clear();
    s.logits.resize(s.chosen.len(), 0.0);
    match f.fc2_interleaved {
        Some(il) => {
            let mut at = 0;
            for &i in &spans {
                let r = span_range(i);
                il.run_rows(
                    level,
                    &s.hidden_acts,
                    r.start,
                    r.end,
                    &mut s.logits[at..][..r.len()],
                );
                at += r.len();
            }
        }
        None => {
            gather_rows_serial(level, &f.fc2, &s.chosen, &s.hidden_acts, 1, &mut s.logits);
        }
    }
    let mut m = 0;
    for p in 0..s.chosen.len() {
        if s.logits[p] >= f.threshold {
            s.chosen[m] = s.chosen[p];
            m += 1;
        }
    }
    s.chosen.truncate(m);
    // the hot rows of the task's spans, all of them; then the chosen rows after them
    let n_hot = f.hot.map_or(0, |(gate, _)| gate.rows());
    s.hot_gate.resize(n_hot, 0.0);
    s.hot_up.resize(n_hot, 0.0);
    if let Some((gate, up)) = f.hot {
        for &i in &spans {
            let r = span_range(i);
            let end = r.end.min(n_hot);
            if r.start < end {
                gate.run_rows(
                    level,
                    &inputs[1],
                    r.start,
                    end,
                    &mut s.hot_gate[r.start..end],
                );
                up.run_rows(level, &inputs[2], r.start, end, &mut s.hot_up[r.start..end]);
            }
        }
    }
    let first_cold = s.chosen.partition_point(|&i| (i as usize) < n_hot);
    let cold = &s.chosen[first_cold..];
    s.gate.clear();
    s.gate.resize(cold.len(), 0.0);
    gather_rows_serial(level, &f.gate, cold, &inputs[1], 1, &mut s.gate);
    s.up.clear();
    s.up.resize(cold.len(), 0.0);
    if f.gate_decides {
        // the up rows of the neurons whose gate is positive only: the others are zero anyway
        s.up_at.clear();
        s.up_rows.clear();
        for (k, (&i, &g)) in cold.iter().zip(&s.gate).enumerate() {
            if g > 0.0 {
                s.up_at.push(k as u32);
                s.up_rows.push(i);
            }
        }
        s.up_firing.clear();
        s.up_firing.resize(s.up_rows.len(), 0.0);
        gather_rows_serial(level, &f.up, &s.up_rows, &inputs[2], 1, &mut s.up_firing);
        for (&k, &u) in s.up_at.iter().zip(&s.up_firing) {
            s.up[k as usize] = u;
        }
    } else {
        gather_rows_serial(level, &f.up, cold, &inputs[2], 1, &mut s.up);
    }
    let mut p = 0;
    for &i in &spans {
        let r = span_range(i);
        // SAFETY: `out` holds n_ff values, and this span belongs to this task alone.
        let a = unsafe { std::slice::from_raw_parts_mut(out.0.add(r.start), r.len()) };
        a.fill(0.0);
        while p < m && (s.chosen[p] as usize) < r.end {
            let n = s.chosen[p] as usize;
            let (g, u) = match n < n_hot {
                true => (s.hot_gate[n], s.hot_up[n]),
                false => (s.gate[p - first_cold], s.up[p - first_cold]),
            };
            a[n - r.start] = combine(g, gated_up(f.gate_decides, g, u));
            p += 1;
        }
        if let Some(block) = block {
            round_with(&mut s.round, down_kind, block, a, 1, r.len());
        }
    }
    s.spans = spans;
    m
}

#[cfg(test)]
mod tests {
    use super::super::tests::Rng;
    use super::super::{gather_matmul, matmul, round_like_matmul_input};
    use super::*;
    use crate::quant::quantize;

    const EMBD: usize = 256;
    const RANK: usize = 32;
    const N_FF: usize = 768;

    fn weights(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
        let f: Vec<f32> = (0..rows * cols).map(|_| rng.f()).collect();
        let mut data = vec![0u8; ty.row_bytes(cols as u64).unwrap() as usize * rows];
        quantize(ty, &f, &mut data).unwrap();
        data
    }

    fn pool(n: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
    }

    fn combine(g: f32, u: f32) -> f32 {
        g.max(0.0) * u
    }

    /// The separate steps the fused operator replaces: its definition.
    fn reference(f: &PredictedFfn, x: &[f32], h: &[f32]) -> (Vec<f32>, usize) {
        let mut hidden = vec![0f32; f.fc1.rows];
        match f.fc1_interleaved {
            Some(il) => il.matmul(x, 1, &mut hidden).unwrap(),
            None => matmul(&f.fc1, x, 1, &mut hidden).unwrap(),
        }
        hidden.iter_mut().for_each(|v| *v = v.max(0.0));
        let mut logits = vec![0f32; f.fc2.rows];
        match f.fc2_interleaved {
            Some(il) => il.matmul(&hidden, 1, &mut logits).unwrap(),
            None => matmul(&f.fc2, &hidden, 1, &mut logits).unwrap(),
        }
        let chosen: Vec<u32> = (0..logits.len() as u32)
            .filter(|&i| logits[i as usize] >= f.threshold)
            .collect();
        let mut g = vec![0f32; chosen.len()];
        let mut u = vec![0f32; chosen.len()];
        gather_matmul(&f.gate, &chosen, h, 1, &mut g).unwrap();
        gather_matmul(&f.up, &chosen, h, 1, &mut u).unwrap();
        if let Some((hot_gate, hot_up)) = f.hot {
            // the hot rows from the whole product of the interleaved copies
            let n_hot = hot_gate.rows();
            let (mut hg, mut hu) = (vec![0f32; n_hot], vec![0f32; n_hot]);
            hot_gate.matmul(h, 1, &mut hg).unwrap();
            hot_up.matmul(h, 1, &mut hu).unwrap();
            for (k, &i) in chosen
                .iter()
                .enumerate()
                .filter(|(_, &i)| (i as usize) < n_hot)
            {
                (g[k], u[k]) = (hg[i as usize], hu[i as usize]);
            }
        }
        let mut a = vec![0f32; f.gate.rows];
        for (k, &i) in chosen.iter().enumerate() {
            a[i as usize] = combine(g[k], gated_up(f.gate_decides, g[k], u[k]));
        }
        round_like_matmul_input(f.down_ty, &mut a, 1, N_FF).unwrap();
        (a, chosen.len())
    }

    /// A threshold that chooses about a third of the neurons.
    fn threshold_for(f: &PredictedFfn, x: &[f32]) -> f32 {
        let mut hidden = vec![0f32; f.fc1.rows];
        matmul(&f.fc1, x, 1, &mut hidden).unwrap();
        hidden.iter_mut().for_each(|v| *v = v.max(0.0));
        let mut logits = vec![0f32; f.fc2.rows];
        matmul(&f.fc2, &hidden, 1, &mut logits).unwrap();
        logits.sort_by(f32::total_cmp);
        logits[logits.len() * 2 / 3]
    }

    #[test]
    fn fused_equals_the_separate_steps_bit_for_bit_at_every_thread_count() {
        let mut rng = Rng(7);
        let predictor_types = [GgmlType::F16, GgmlType::Q8_0];
        let weight_types = [
            GgmlType::F16,
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_K,
        ];
        let down_types = [GgmlType::F16, GgmlType::Q4_0, GgmlType::F32, GgmlType::Q6_K];
        for (case, (&pty, &wty)) in predictor_types
            .iter()
            .cycle()
            .zip(&weight_types)
            .enumerate()
        {
            let fc1 = weights(pty, RANK, EMBD, &mut rng);
            let fc2 = weights(pty, N_FF, RANK, &mut rng);
            let gate = weights(wty, N_FF, EMBD, &mut rng);
            let up = weights(wty, N_FF, EMBD, &mut rng);
            let x: Vec<f32> = (0..EMBD).map(|_| rng.f()).collect();
            let h: Vec<f32> = (0..EMBD).map(|_| rng.f()).collect();
            let mut f = PredictedFfn {
                fc1: Matrix::new(pty, RANK, EMBD, &fc1).unwrap(),
                fc2: Matrix::new(pty, N_FF, RANK, &fc2).unwrap(),
                fc1_interleaved: None,
                fc2_interleaved: None,
                gate: Matrix::new(wty, N_FF, EMBD, &gate).unwrap(),
                up: Matrix::new(wty, N_FF, EMBD, &up).unwrap(),
                hot: None,
                threshold: 0.0,
                gate_decides: false,
                down_ty: down_types[case],
            };
            f.threshold = threshold_for(&f, &x);
            let down = weights(f.down_ty, N_FF, EMBD, &mut rng);
            let down = Matrix::new(f.down_ty, N_FF, EMBD, &down).unwrap();
            check_fused(&f, &x, &h, &down);
            // with the up rows of non-positive gates skipped (ReLU)
            check_fused(
                &PredictedFfn {
                    gate_decides: true,
                    ..f
                },
                &x,
                &h,
                &down,
            );
            // with interleaved copies: of fc1 and fc2, and of the first 160 rows of gate and up
            // (a span of 64 partly hot)
            let interleave = |ty: GgmlType, rows: usize, cols: usize, w: &[u8]| {
                Interleaved::TYPES.contains(&ty).then(|| {
                    Interleaved::from_matrix(&Matrix::new(ty, rows, cols, w).unwrap()).unwrap()
                })
            };
            let fc1_il = interleave(pty, RANK, EMBD, &fc1);
            let fc2_il = interleave(pty, N_FF, RANK, &fc2);
            let n_hot = 160;
            let rb = wty.row_bytes(EMBD as u64).unwrap() as usize;
            let hot_gate = interleave(wty, n_hot, EMBD, &gate[..n_hot * rb]);
            let hot_up = interleave(wty, n_hot, EMBD, &up[..n_hot * rb]);
            if fc2_il.is_some() || hot_gate.is_some() {
                f.fc1_interleaved = fc1_il.as_ref();
                f.fc2_interleaved = fc2_il.as_ref();
                f.hot = hot_gate.as_ref().zip(hot_up.as_ref());
                check_fused(&f, &x, &h, &down);
                f.gate_decides = true;
                check_fused(&f, &x, &h, &down);
            }
        }
    }

    /// The down projection the fused operator sums: each band's neurons through
    /// [`sparse_axpy`](super::super::sparse_axpy) on their own, the bands added in order.
    fn reference_down(w_t: &Matrix, a: &[f32], block: Option<usize>) -> Vec<f32> {
        let span = span_for(block);
        let mut y = vec![0f32; w_t.cols];
        for band in 0..BANDS {
            let mut masked = vec![0f32; a.len()];
            for (i, (m, &v)) in masked.iter_mut().zip(a).enumerate() {
                if i / span % BANDS == band {
                    *m = v;
                }
            }
            let mut part = vec![0f32; w_t.cols];
            super::super::sparse_axpy(w_t, &masked, 1, &mut part).unwrap();
            match band {
                0 => y = part,
                _ => y.iter_mut().zip(&part).for_each(|(y, p)| *y += p),
            }
        }
        y
    }

    /// The fused operator against [`reference`] (and [`reference_down`] with `down`), bit for
    /// bit, at 1, 2 and 3 threads.
    fn check_fused(f: &PredictedFfn, x: &[f32], h: &[f32], down: &Matrix) {
        let (want, want_n) = reference(f, x, h);
        let block = rounding_block(kind_for(f.down_ty).unwrap());
        let want_y = reference_down(down, &want, block);
        assert!(want_n > N_FF / 5 && want_n < N_FF / 2, "{want_n} chosen");
        let (pty, wty) = (f.fc2.ty, f.gate.ty);
        let copies = (
            f.fc1_interleaved.is_some(),
            f.fc2_interleaved.is_some(),
            f.hot.is_some(),
        );
        let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
        for threads in [1, 2, 3] {
            for with_down in [false, true] {
                let mut a = vec![f32::NAN; N_FF];
                let mut y = vec![f32::NAN; EMBD];
                let d = with_down.then_some((down, &mut y[..]));
                let n = pool(threads)
                    .install(|| predicted_activations(f, combine, x, h, &mut a, d))
                    .unwrap();
                assert_eq!(n, want_n, "{pty} {wty} {copies:?} {threads} threads");
                let case = format!(
                    "{pty} {wty} {copies:?} down {}: {threads} threads",
                    f.down_ty
                );
                assert!(same(&a, &want), "{case}");
                assert!(!with_down || same(&y, &want_y), "{case}: down projection");
            }
        }
    }

    #[test]
    fn mismatched_shapes_and_partial_blocks_are_errors() {
        let mut rng = Rng(3);
        let t = GgmlType::F16;
        let fc1 = weights(t, RANK, EMBD, &mut rng);
        let fc2 = weights(t, N_FF, RANK, &mut rng);
        let gate = weights(t, N_FF, EMBD, &mut rng);
        let f = PredictedFfn {
            fc1: Matrix::new(t, RANK, EMBD, &fc1).unwrap(),
            fc2: Matrix::new(t, N_FF, RANK, &fc2).unwrap(),
            fc1_interleaved: None,
            fc2_interleaved: None,
            gate: Matrix::new(t, N_FF, EMBD, &gate).unwrap(),
            up: Matrix::new(t, N_FF, EMBD, &gate).unwrap(),
            hot: None,
            threshold: 0.0,
            gate_decides: true,
            down_ty: GgmlType::Q4_0,
        };
        let v = vec![0.5f32; EMBD];
        let mut a = vec![0f32; N_FF];
        assert!(predicted_activations(&f, combine, &v, &v, &mut a, None).is_ok());
        let err = |f: &PredictedFfn, x: &[f32], a: &mut [f32]| {
            matches!(
                predicted_activations(f, combine, x, &v, a, None),
                Err(Error::InvalidArgument(_))
            )
        };
        assert!(err(&f, &v[..EMBD - 32], &mut a));
        assert!(err(&f, &v, &mut a[..N_FF - 32]));
        let short = PredictedFfn {
            fc2: Matrix::new(t, N_FF - 16, RANK, &fc2[..(N_FF - 16) * RANK * 2]).unwrap(),
            gate: Matrix::new(t, N_FF - 16, EMBD, &gate[..(N_FF - 16) * EMBD * 2]).unwrap(),
            up: Matrix::new(t, N_FF - 16, EMBD, &gate[..(N_FF - 16) * EMBD * 2]).unwrap(),
            ..f
        };
        // 752 neurons are not a whole number of Q8_0 blocks (Q4_0's down input)
        assert!(err(&short, &v, &mut a[..N_FF - 16]));
    }
}
