//! One token's predicted sparse FFN activations in a single parallel region: PowerInfer's
//! predictor (`fc2 · relu(fc1 · x)`), the choice of the neurons whose logit reaches the threshold,
//! the gate and up rows of the chosen neurons, their activations, and the rounding of those
//! activations for the down projection, all in one task per thread.
//!
//! The separate steps (two [`matmul`](super::matmul)s, a selection, a
//! [`gather_matmul`](super::gather_matmul) of gate and of up, a rounding) are five parallel regions
//! with a thread wake-up and a join each; a layer of a small model is tens of microseconds, so those
//! dominate. Here each task computes the predictor's small hidden layer itself (a few KiB of
//! weights) and then walks its own spans of neurons, so nothing waits for anything. Every value is
//! computed by the same kernels on the same quantised inputs as the separate steps, so the result
//! is bit-identical to them and does not depend on the thread count.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

use super::act::{ActKind, Acts};
use super::sparse::gather_rows_serial;
use super::{
    kernel_for, kind_for, offset_shift, round_with, rounding_block, Level, Matrix, OutPtr,
};
use crate::quant::GgmlType;
use crate::{Error, Result};

/// Neurons per span: a multiple of every activation rounding block (Q8_K's 256), so that rounding a
/// span on its own rounds it as the whole row would be rounded.
const SPAN: usize = 256;

/// The weights of one layer's predicted sparse FFN (an FFN with gate, without biases).
#[derive(Clone, Copy, Debug)]
pub struct PredictedFfn<'a> {
    /// The predictor's first layer: `R` rows of `n_embd`.
    pub fc1: Matrix<'a>,
    /// The predictor's second layer: `n_ff` rows of `R`.
    pub fc2: Matrix<'a>,
    /// `ffn_gate`: `n_ff` rows of `n_embd`.
    pub gate: Matrix<'a>,
    /// `ffn_up`: `n_ff` rows of `n_embd`.
    pub up: Matrix<'a>,
    /// A neuron is chosen when its predicted logit is at least this.
    pub threshold: f32,
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
    round: Acts,
}

thread_local! {
    /// Each worker's [`Scratch`] (taken out during a task, so a nested call just allocates).
    static SCRATCH: Cell<Option<Box<Scratch>>> = const { Cell::new(None) };
    /// The caller's quantised inputs (x for fc1, h for gate and for up).
    static INPUTS: Cell<Option<Box<[Acts; 3]>>> = const { Cell::new(None) };
}

/// The activations `a` (`n_ff` values) of one token's FFN: for each neuron `i` with
/// `(fc2 · relu(fc1 · x))[i] >= threshold`, `a[i] = combine(gate_i · h, up_i · h)` rounded like the
/// down projection's input; `0` for the others. `x` is the predictor's input and `h` the FFN's
/// (both `n_embd` values). Returns the number of chosen neurons.
///
/// Bit-identical to [`matmul`](super::matmul) of fc1, relu, `matmul` of fc2, the selection,
/// [`gather_matmul`](super::gather_matmul) of gate and up over the chosen rows, `combine` and
/// [`round_like_matmul_input`](super::round_like_matmul_input), at every thread count. Runs as one
/// parallel region on the current rayon pool.
///
/// Errors: [`Error::InvalidArgument`] for malformed or mismatched matrices or wrong lengths;
/// [`Error::UnsupportedType`] for a weight type without kernels.
pub fn predicted_activations(
    f: &PredictedFfn,
    combine: impl Fn(f32, f32) -> f32 + Sync,
    x: &[f32],
    h: &[f32],
    a: &mut [f32],
) -> Result<usize> {
    let kinds = check(f, x, h, a)?;
    let n_ff = a.len();
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
    let spans = n_ff.div_ceil(SPAN);
    let tasks = rayon::current_num_threads().clamp(1, spans);
    let task = |k: usize| {
        let mut s = SCRATCH.with(|c| c.take()).unwrap_or_default();
        hidden(f, level, &inputs[0], &mut s);
        let n = task_activations(f, level, &inputs, &combine, kinds, k, tasks, out, &mut s);
        chosen.fetch_add(n, Ordering::Relaxed);
        SCRATCH.with(|c| c.set(Some(s)));
    };
    if tasks == 1 {
        task(0);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
    INPUTS.with(|c| c.set(Some(inputs)));
    Ok(chosen.into_inner())
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
    s.chosen.clear();
    s.chosen.extend(0..r as u32);
    gather_rows_serial(
        kernel_for(level, f.fc1.ty),
        &f.fc1,
        &s.chosen,
        x,
        1,
        &mut s.hidden,
    );
    s.hidden.iter_mut().for_each(|v| *v = v.max(0.0));
    let kind = kind_for(f.fc2.ty).expect("checked");
    s.hidden_acts
        .quantize(level, kind, offset_shift(f.fc2.ty), &s.hidden, 1, r);
}

/// The activations of task `k` of `tasks`: the spans `k, k + tasks, …` of `a` (at `out`, `n_ff`
/// values). Each step runs over all the task's spans at once (the predictor's rows, then the chosen
/// gate rows, then the up rows), so the rows stream with prefetch as in the separate operators.
/// Returns the number of chosen neurons.
#[allow(clippy::too_many_arguments)]
fn task_activations(
    f: &PredictedFfn,
    level: Level,
    inputs: &[Acts; 3],
    combine: &impl Fn(f32, f32) -> f32,
    (down_kind, block): (ActKind, Option<usize>),
    k: usize,
    tasks: usize,
    out: OutPtr,
    s: &mut Scratch,
) -> usize {
    let n_ff = f.gate.rows;
    let spans = (k..n_ff.div_ceil(SPAN)).step_by(tasks);
    let span_range = |span: usize| span * SPAN..((span + 1) * SPAN).min(n_ff);
    // the predictor's logits of the task's neurons, and the chosen ones (ascending)
    s.chosen.clear();
    for span in spans.clone() {
        s.chosen.extend(span_range(span).map(|i| i as u32));
    }
    s.logits.clear();
    s.logits.resize(s.chosen.len(), 0.0);
    let fc2 = kernel_for(level, f.fc2.ty);
    gather_rows_serial(fc2, &f.fc2, &s.chosen, &s.hidden_acts, 1, &mut s.logits);
    let mut m = 0;
    for p in 0..s.chosen.len() {
        if s.logits[p] >= f.threshold {
            s.chosen[m] = s.chosen[p];
            m += 1;
        }
    }
    s.chosen.truncate(m);
    for (y, w, acts) in [
        (&mut s.gate, &f.gate, &inputs[1]),
        (&mut s.up, &f.up, &inputs[2]),
    ] {
        y.clear();
        y.resize(m, 0.0);
        gather_rows_serial(kernel_for(level, w.ty), w, &s.chosen, acts, 1, y);
    }
    let mut p = 0;
    for span in spans {
        let r = span_range(span);
        // SAFETY: `out` holds n_ff values, and this span belongs to this task alone (task k takes
        // the spans k, k + tasks, …).
        let a = unsafe { std::slice::from_raw_parts_mut(out.0.add(r.start), r.len()) };
        a.fill(0.0);
        while p < m && (s.chosen[p] as usize) < r.end {
            a[s.chosen[p] as usize - r.start] = combine(s.gate[p], s.up[p]);
            p += 1;
        }
        if let Some(block) = block {
            round_with(&mut s.round, down_kind, block, a, 1, r.len());
        }
    }
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
        matmul(&f.fc1, x, 1, &mut hidden).unwrap();
        hidden.iter_mut().for_each(|v| *v = v.max(0.0));
        let mut logits = vec![0f32; f.fc2.rows];
        matmul(&f.fc2, &hidden, 1, &mut logits).unwrap();
        let chosen: Vec<u32> = (0..logits.len() as u32)
            .filter(|&i| logits[i as usize] >= f.threshold)
            .collect();
        let mut g = vec![0f32; chosen.len()];
        let mut u = vec![0f32; chosen.len()];
        gather_matmul(&f.gate, &chosen, h, 1, &mut g).unwrap();
        gather_matmul(&f.up, &chosen, h, 1, &mut u).unwrap();
        let mut a = vec![0f32; f.gate.rows];
        for (k, &i) in chosen.iter().enumerate() {
            a[i as usize] = combine(g[k], u[k]);
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
                gate: Matrix::new(wty, N_FF, EMBD, &gate).unwrap(),
                up: Matrix::new(wty, N_FF, EMBD, &up).unwrap(),
                threshold: 0.0,
                down_ty: down_types[case],
            };
            f.threshold = threshold_for(&f, &x);
            let (want, want_n) = reference(&f, &x, &h);
            assert!(want_n > N_FF / 5 && want_n < N_FF / 2, "{want_n} chosen");
            for threads in [1, 2, 3] {
                let mut a = vec![f32::NAN; N_FF];
                let n = pool(threads)
                    .install(|| predicted_activations(&f, combine, &x, &h, &mut a))
                    .unwrap();
                assert_eq!(n, want_n, "{pty} {wty} {threads} threads");
                let same = a.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{pty} {wty} down {}: {threads} threads", f.down_ty);
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
            gate: Matrix::new(t, N_FF, EMBD, &gate).unwrap(),
            up: Matrix::new(t, N_FF, EMBD, &gate).unwrap(),
            threshold: 0.0,
            down_ty: GgmlType::Q4_0,
        };
        let v = vec![0.5f32; EMBD];
        let mut a = vec![0f32; N_FF];
        assert!(predicted_activations(&f, combine, &v, &v, &mut a).is_ok());
        let err = |f: &PredictedFfn, x: &[f32], a: &mut [f32]| {
            matches!(
                predicted_activations(f, combine, x, &v, a),
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
