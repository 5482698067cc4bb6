//! Sparse FFN operators: [`gather_matmul`] (gate/up rows of the active neurons for every token),
//! [`gather_matmul_sets`] (only each token's own chosen rows) and [`sparse_axpy`] (the down
//! projection as a sum of the active neurons' rows of the transposed, neuron-major down matrix).
//!
//! [`gather_matmul`] reuses the dense path's activation quantisation and row kernels (and, for
//! batches on AVX-512, its packed kernels), so each gathered output is bit-identical to the same
//! entry of [`matmul`](super::matmul). Consecutive indices that form a contiguous run of rows are
//! handed to the kernels together (up to [`MR`] rows), as in the dense path. [`gather_matmul_sets`]
//! reads each row of the union of the tokens' sets once and runs the same row kernels on it for
//! the runs of consecutive tokens that chose it, so it gives the same bits with less work.
//!
//! [`sparse_axpy`] dequantises each active row segment exactly (every supported format's values
//! are exact f32 products) and accumulates `out = fma(a, w, out)` element by element, in neuron
//! index order. Work is split over fixed column ranges, each walked by one task over all active
//! neurons, so the result does not depend on the thread count; and as every path (scalar,
//! AVX2/FMA, AVX-512) performs the same fused multiply-adds in the same order, not on the SIMD
//! path either. For a batch, each row segment is decoded once for all tokens that need it.

use rayon::prelude::*;

use crate::quant::{GgmlType, QK};
use crate::{Error, Result};

use super::act::{ActKind, Acts};
use super::{
    kernel_for, kind_for, offset_shift, packed_for, prefetch, rows_kernel_for, Kernel, Level,
    Matrix, OutPtr, RowsKernel, MR, NT, PREFETCH_AHEAD, SCRATCH,
};

/// Computes `y[t * rows.len() + k] = dot(W row rows[k], x token t)` for `t` in `0..n_tokens`.
///
/// `x` holds `n_tokens` token rows of `w.cols` values; `y` receives `n_tokens` rows of
/// `rows.len()` values. Every output is bit-identical to the corresponding entry of
/// [`matmul`](super::matmul) (same activation quantisation, same kernels). Indices may repeat and
/// come in any order. Runs in parallel on the current rayon pool over chunks of the index list.
///
/// Errors: [`Error::InvalidArgument`] for a malformed matrix, an index `>= w.rows` or wrong
/// `x`/`y` lengths; [`Error::UnsupportedType`] for a weight type without kernels.
pub fn gather_matmul(
    w: &Matrix,
    rows: &[u32],
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
) -> Result<()> {
    gather_matmul_at(Level::current(), w, rows, x, n_tokens, y)
}

pub(crate) fn gather_matmul_at(
    level: Level,
    w: &Matrix,
    rows: &[u32],
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
) -> Result<()> {
    let kind = check_gather(w, "gather_matmul", x, n_tokens)?;
    if n_tokens.checked_mul(rows.len()) != Some(y.len()) {
        return Err(Error::InvalidArgument(format!(
            "y has {} values, expected {n_tokens} tokens × {} gathered rows",
            y.len(),
            rows.len()
        )));
    }
    check_rows(w, rows)?;
    if n_tokens == 0 || rows.is_empty() {
        return Ok(());
    }

    let mut acts = SCRATCH.with(|s| s.take()).unwrap_or_default();
    acts.quantize(level, kind, offset_shift(w.ty), x, n_tokens, w.cols);
    match packed_for(level, w, n_tokens) {
        #[cfg(target_arch = "x86_64")]
        Some((packer, pk)) => gather_packed(packer, pk, w, rows, &acts, n_tokens, y),
        _ => gather_rows(level, w, rows, &acts, n_tokens, y),
    }
    SCRATCH.with(|s| s.set(Some(acts)));
    Ok(())
}

/// Checks a gather's matrix (well-formed, with kernels) and its `n_tokens` input rows `x`;
/// returns the activation quantisation for the matrix's type.
fn check_gather(w: &Matrix, op: &'static str, x: &[f32], n_tokens: usize) -> Result<ActKind> {
    w.validate()?;
    let kind = kind_for(w.ty).ok_or(Error::UnsupportedType {
        ty: w.ty.name(),
        op,
    })?;
    if n_tokens.checked_mul(w.cols) != Some(x.len()) {
        return Err(Error::InvalidArgument(format!(
            "x has {} values, expected {n_tokens} tokens × {} columns",
            x.len(),
            w.cols
        )));
    }
    Ok(kind)
}

/// Checks that every index of `rows` is a row of `w`.
fn check_rows(w: &Matrix, rows: &[u32]) -> Result<()> {
    match rows.iter().find(|&&r| r as usize >= w.rows) {
        Some(bad) => Err(Error::InvalidArgument(format!(
            "row index {bad} out of range for a matrix of {} rows",
            w.rows
        ))),
        None => Ok(()),
    }
}

/// Length of the run of contiguous rows starting at `idx[k]` (at most `max`, within `..end`).
#[inline]
fn run_len(idx: &[u32], k: usize, end: usize, max: usize) -> usize {
    let r = idx[k];
    let mut n = 1;
    while n < max && k + n < end && idx[k + n] == r + n as u32 {
        n += 1;
    }
    n
}

/// The dense path's `run_rows` over the gathered rows `idx`.
fn gather_rows(level: Level, w: &Matrix, idx: &[u32], acts: &Acts, n_tokens: usize, y: &mut [f32]) {
    let n = idx.len();
    let chunk = gather_chunk(n, w.row_bytes(), n_tokens);
    let n_chunks = n.div_ceil(chunk);
    let out = OutPtr(y.as_mut_ptr());
    for_each_chunk(n_chunks, move |c| {
        let k0 = c * chunk;
        // SAFETY: y holds n_tokens × n values, and indices k0..k0+chunk belong to this task alone.
        unsafe { gather_rows_range(level, w, idx, k0, (k0 + chunk).min(n), acts, n_tokens, out) }
    });
}

/// [`gather_rows`] on the calling thread alone.
pub(super) fn gather_rows_serial(
    level: Level,
    w: &Matrix,
    idx: &[u32],
    acts: &Acts,
    n_tokens: usize,
    y: &mut [f32],
) {
    assert_eq!(y.len(), n_tokens * idx.len(), "gathered output size");
    // SAFETY: y holds n_tokens × idx.len() values and is borrowed mutably here.
    unsafe {
        gather_rows_range(
            level,
            w,
            idx,
            0,
            idx.len(),
            acts,
            n_tokens,
            OutPtr(y.as_mut_ptr()),
        )
    }
}

thread_local! {
    /// Each thread's copy of a single-token gather's lone rows, contiguous for the kernel.
    static STAGE: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The outputs of the gathered rows `idx[k0..k1]` for every token: `out[t * idx.len() + k]`.
///
/// # Safety
/// `out` must point to `n_tokens × idx.len()` values, of which the caller lets this call alone
/// write the entries of `k0..k1`.
#[allow(clippy::too_many_arguments)]
unsafe fn gather_rows_range(
    level: Level,
    w: &Matrix,
    idx: &[u32],
    k0: usize,
    k1: usize,
    acts: &Acts,
    n_tokens: usize,
    out: OutPtr,
) {
    let n = idx.len();
    let rb = w.row_bytes();
    let (kernel, rows_kernel) = (kernel_for(level, w.ty), rows_kernel_for(level, w.ty));
    let ahead = (PREFETCH_AHEAD / rb.max(1)).max(1);
    let mut tile = [0f32; MR * NT];
    let mut stage = STAGE.with(|s| s.take());
    let mut t0 = 0;
    while t0 < n_tokens {
        let nt = (n_tokens - t0).min(NT);
        let mut k = k0;
        let mut pf = k0;
        while k < k1 {
            let nr = run_len(idx, k, k1, MR);
            if t0 == 0 {
                // prefetch the rows `ahead` indices in front of the ones being read
                while pf < k1 && pf < k + nr + ahead {
                    prefetch_row(w, idx[pf], rb);
                    pf += 1;
                }
            }
            let r = idx[k] as usize;
            let mut nr = nr;
            if nr < MR && n_tokens == 1 {
                // lone rows: up to MR of them in one kernel call (each row's result does not
                // depend on its neighbours), read where they are by a row-gather kernel, or else
                // copied together
                nr = k1.min(k + MR) - k;
                while pf < k1 && pf < k + nr + ahead {
                    prefetch_row(w, idx[pf], rb);
                    pf += 1;
                }
                let rows = &idx[k..k + nr];
                match rows_kernel {
                    Some(rows_kernel) => {
                        let at: [*const u8; MR] = std::array::from_fn(|j| {
                            let i = rows[j.min(nr - 1)] as usize;
                            w.data[i * rb..(i + 1) * rb].as_ptr()
                        });
                        // SAFETY: each address is a whole row of `w`, token 0 exists (t0 = 0
                        // with one token) and the tile holds MR × NT values.
                        unsafe { rows_kernel(&at[..nr], acts, t0, w.cols, &mut tile) };
                    }
                    None => {
                        stage.resize(MR * rb, 0);
                        for (j, &i) in rows.iter().enumerate() {
                            let i = i as usize;
                            stage[j * rb..(j + 1) * rb]
                                .copy_from_slice(&w.data[i * rb..(i + 1) * rb]);
                        }
                        kernel(&stage[..nr * rb], rb, nr, acts, t0, nt, &mut tile);
                    }
                }
            } else {
                kernel(
                    &w.data[r * rb..(r + nr) * rb],
                    rb,
                    nr,
                    acts,
                    t0,
                    nt,
                    &mut tile,
                );
            }
            // SAFETY: t0 + nt <= n_tokens and k + nr <= k1 <= n, so the tile is inside out's
            // n_tokens * n values, in the range k0..k1 the caller gave this call.
            unsafe { out.store_tile(&tile, nr, nt, t0, n, k) };
            k += nr;
        }
        t0 += nt;
    }
    STAGE.with(|s| s.set(stage));
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// Each worker's copy of its gathered rows, contiguous for the packer.
    static GATHERED: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The dense path's `run_rows_packed` over the gathered rows `idx`: each task copies its rows together,
/// unpacks them once and sweeps all token groups over them.
#[cfg(target_arch = "x86_64")]
fn gather_packed(
    packer: super::avx512::Packer,
    pk: super::avx512::PackedKernel,
    w: &Matrix,
    idx: &[u32],
    acts: &Acts,
    n_tokens: usize,
    y: &mut [f32],
) {
    let n = idx.len();
    let rb = w.row_bytes();
    let threads = rayon::current_num_threads().max(1);
    let chunk = n
        .div_ceil(threads * 4)
        .clamp(MR, (super::PACK_CHUNK_BYTES / rb.max(1)).max(MR))
        .div_ceil(MR)
        * MR;
    let n_chunks = n.div_ceil(chunk);
    let out = OutPtr(y.as_mut_ptr());
    let task = move |c: usize| {
        let out = out;
        let k0 = c * chunk;
        let k1 = (k0 + chunk).min(n);
        let mut rows = GATHERED.with(|g| g.take());
        rows.clear();
        for &r in &idx[k0..k1] {
            let r = r as usize;
            rows.extend_from_slice(&w.data[r * rb..(r + 1) * rb]);
        }
        let mut packed = super::PACKED.with(|p| p.take()).unwrap_or_default();
        packer(&rows, rb, k1 - k0, &mut packed);
        let mut tile = [0f32; MR * NT];
        let mut t0 = 0;
        while t0 < n_tokens {
            let nt = (n_tokens - t0).min(NT);
            let mut k = k0;
            while k < k1 {
                let nr = (k1 - k).min(MR);
                pk(&packed, k - k0, nr, acts, t0, nt, &mut tile);
                // SAFETY: as in gather_rows: in bounds, and k0..k1 are this task's.
                unsafe { out.store_tile(&tile, nr, nt, t0, n, k) };
                k += nr;
            }
            t0 += nt;
        }
        super::PACKED.with(|p| p.set(Some(packed)));
        GATHERED.with(|g| g.set(rows));
    };
    for_each_chunk(n_chunks, task);
}

/// Computes, for each token `t` and each index `sets[t][k]`,
/// `y[off(t) + k] = dot(W row sets[t][k], x token t)` with `off(t) = Σ_{s<t} sets[s].len()`: only
/// the (token, row) pairs asked for, in the tokens' order and each token's set order.
///
/// `x` holds `sets.len()` token rows of `w.cols` values. Every output is bit-identical to the
/// corresponding entry of [`matmul`](super::matmul) (same activation quantisation, same row
/// kernels). Each row of the union of the sets is read once, and its dot products are computed
/// only for the tokens whose set holds it (those within [`NT`] consecutive tokens in one kernel
/// call, whose independent dot products overlap). Indices may repeat and come in any order. Runs in parallel on the current rayon pool
/// over chunks of the union's rows; the result does not depend on the thread count.
///
/// Errors: [`Error::InvalidArgument`] for a malformed matrix, an index `>= w.rows` or wrong
/// `x`/`y` lengths; [`Error::UnsupportedType`] for a weight type without kernels.
pub fn gather_matmul_sets<S: AsRef<[u32]>>(
    w: &Matrix,
    sets: &[S],
    x: &[f32],
    y: &mut [f32],
) -> Result<()> {
    gather_matmul_sets_at(Level::current(), w, sets, x, y)
}

/// [`gather_matmul_sets`] of several matrices with the same rows over the same sets and input, in
/// one parallel region: `ys[m]` receives matrix `ws[m]`'s outputs, bit-identical to a
/// [`gather_matmul_sets`] call on it. The (token, row) pairs are grouped once for all the
/// matrices, and each task computes its rows of every matrix (gate and up of a batched sparse FFN).
///
/// Errors: as [`gather_matmul_sets`], and [`Error::InvalidArgument`] when `ws` and `ys` differ in
/// length or the matrices in their number of rows.
pub fn gather_matmul_sets_multi<S: AsRef<[u32]>>(
    ws: &[Matrix],
    sets: &[S],
    x: &[f32],
    ys: &mut [&mut [f32]],
) -> Result<()> {
    gather_multi_at(Level::current(), ws, sets, x, ys)
}

pub(crate) fn gather_matmul_sets_at<S: AsRef<[u32]>>(
    level: Level,
    w: &Matrix,
    sets: &[S],
    x: &[f32],
    y: &mut [f32],
) -> Result<()> {
    gather_multi_at(level, std::slice::from_ref(w), sets, x, &mut [y])
}

fn gather_multi_at<S: AsRef<[u32]>>(
    level: Level,
    ws: &[Matrix],
    sets: &[S],
    x: &[f32],
    ys: &mut [&mut [f32]],
) -> Result<()> {
    if ws.len() != ys.len() {
        return Err(Error::InvalidArgument(format!(
            "{} matrices but {} outputs",
            ws.len(),
            ys.len()
        )));
    }
    let n_tokens = sets.len();
    let pairs: usize = sets.iter().map(|s| s.as_ref().len()).sum();
    let mut kinds = Vec::with_capacity(ws.len());
    for (w, y) in ws.iter().zip(ys.iter()) {
        kinds.push(check_gather(w, "gather_matmul_sets", x, n_tokens)?);
        if w.rows != ws[0].rows {
            return Err(Error::InvalidArgument(format!(
                "matrices of {} and {} rows gathered together",
                ws[0].rows, w.rows
            )));
        }
        if pairs != y.len() {
            return Err(Error::InvalidArgument(format!(
                "y has {} values, expected {pairs} (the sets' total length)",
                y.len()
            )));
        }
    }
    if u32::try_from(pairs).is_err() {
        return Err(Error::InvalidArgument(format!(
            "{pairs} (token, row) pairs are too many for one call"
        )));
    }
    let Some(first) = ws.first() else {
        return Ok(());
    };
    for set in sets {
        check_rows(first, set.as_ref())?;
    }
    if pairs == 0 {
        return Ok(());
    }

    let mut acts = SET_ACTS.with(|s| s.take());
    acts.resize_with(ws.len(), Acts::default);
    for ((a, w), &kind) in acts.iter_mut().zip(ws).zip(&kinds) {
        a.quantize(level, kind, offset_shift(w.ty), x, n_tokens, w.cols);
    }
    if let [only] = sets {
        // one token: its outputs are gather_matmul's, which runs contiguous rows together
        for ((w, a), y) in ws.iter().zip(&acts).zip(ys.iter_mut()) {
            gather_rows(level, w, only.as_ref(), a, 1, y);
        }
    } else {
        let mut pairs = PAIRS.with(|p| p.take()).unwrap_or_default();
        pairs.build(sets, first.rows);
        let jobs: Vec<GatherJob> = ws
            .iter()
            .zip(&acts)
            .zip(ys.iter_mut())
            .map(|((w, a), y)| GatherJob {
                kernel: kernel_for(level, w.ty),
                rows: rows_kernel_for(level, w.ty),
                w,
                acts: a,
                out: OutPtr(y.as_mut_ptr()),
            })
            .collect();
        gather_pairs(&jobs, &pairs, n_tokens);
        PAIRS.with(|p| p.set(Some(pairs)));
    }
    SET_ACTS.with(|s| s.set(acts));
    Ok(())
}

thread_local! {
    /// Reused per-matrix activations of [`gather_matmul_sets_multi`].
    static SET_ACTS: std::cell::Cell<Vec<Acts>> = const { std::cell::Cell::new(Vec::new()) };
}

/// One matrix of a [`gather_pairs`] call: its kernel, its quantised input and its output.
struct GatherJob<'a> {
    kernel: Kernel,
    /// The row-gather kernel of the matrix's type, where there is one.
    rows: Option<RowsKernel>,
    w: &'a Matrix<'a>,
    acts: &'a Acts,
    out: OutPtr,
}

/// The (token, row) pairs of a [`gather_matmul_sets`] call grouped by row: row `rows[j]` is
/// needed by the tokens `toks[start[j]..start[j+1]]` (ascending), whose outputs go to `y[outs[..]]`
/// at the same positions.
#[derive(Default)]
struct Pairs {
    rows: Vec<u32>,
    start: Vec<u32>,
    toks: Vec<u32>,
    outs: Vec<u32>,
    /// Per matrix row: its pair count, then its next free position in `toks`/`outs`.
    cursor: Vec<u32>,
}

impl Pairs {
    /// Groups the sets' pairs by row (a counting sort; `sets` are in range, their total fits u32).
    fn build<S: AsRef<[u32]>>(&mut self, sets: &[S], n_rows: usize) {
        self.rows.clear();
        self.start.clear();
        self.cursor.clear();
        self.cursor.resize(n_rows, 0);
        for &r in sets.iter().flat_map(|s| s.as_ref()) {
            self.cursor[r as usize] += 1;
        }
        let mut pos = 0u32;
        for (r, c) in self.cursor.iter_mut().enumerate() {
            if *c > 0 {
                self.rows.push(r as u32);
                self.start.push(pos);
                (pos, *c) = (pos + *c, pos);
            }
        }
        self.start.push(pos);
        self.toks.clear();
        self.toks.resize(pos as usize, 0);
        self.outs.clear();
        self.outs.resize(pos as usize, 0);
        let mut off = 0u32;
        for (t, set) in sets.iter().enumerate() {
            for &r in set.as_ref() {
                let p = self.cursor[r as usize] as usize;
                self.cursor[r as usize] += 1;
                self.toks[p] = t as u32;
                self.outs[p] = off;
                off += 1;
            }
        }
    }
}

thread_local! {
    /// Reused pair lists (taken out during a call, so nested calls just allocate).
    static PAIRS: std::cell::Cell<Option<Box<Pairs>>> = const { std::cell::Cell::new(None) };
}

/// Runs the pairs: each task walks a chunk of the union's rows, prefetching ahead, and computes
/// each row's dots, of every job's matrix, for its runs of consecutive tokens.
fn gather_pairs(jobs: &[GatherJob], p: &Pairs, n_tokens: usize) {
    let n = p.rows.len();
    let rb: usize = jobs.iter().map(|j| j.w.row_bytes()).sum();
    let chunk = gather_chunk(n, rb, 2);
    let n_chunks = n.div_ceil(chunk);
    let ahead = (PREFETCH_AHEAD / rb.max(1)).max(1);
    let by_token = jobs.iter().all(|j| j.rows.is_some());
    let task = move |c: usize| {
        let j0 = c * chunk;
        let j1 = (j0 + chunk).min(n);
        let mut tile = [0f32; MR * NT];
        let mut pf = j0;
        let mut prefetch_to = |j: usize| {
            while pf < j1 && pf <= j + ahead {
                for job in jobs {
                    prefetch_row(job.w, p.rows[pf], job.w.row_bytes());
                }
                pf += 1;
            }
        };
        if by_token {
            gather_by_token(jobs, p, j0..j1, n_tokens, &mut prefetch_to);
            return;
        }
        for j in j0..j1 {
            prefetch_to(j);
            let r = p.rows[j] as usize;
            let (s, e) = (p.start[j] as usize, p.start[j + 1] as usize);
            for job in jobs {
                let rb = job.w.row_bytes();
                let row = &job.w.data[r * rb..(r + 1) * rb];
                let mut q = s;
                while q < e {
                    // the row's tokens within t0..t0 + NT, computed in one call: each token's dot
                    // product is an independent chain of the kernel (the tokens in between that
                    // did not choose the row are computed and dropped), so the calls overlap
                    // their chains instead of waiting on one
                    let t0 = p.toks[q] as usize;
                    let mut m = 1;
                    while m < NT && q + m < e && (p.toks[q + m] as usize) < t0 + NT {
                        m += 1;
                    }
                    let nt = p.toks[q + m - 1] as usize + 1 - t0;
                    (job.kernel)(row, rb, 1, job.acts, t0, nt, &mut tile);
                    for i in q..q + m {
                        let v = tile[p.toks[i] as usize - t0];
                        // SAFETY: outs are distinct positions < the job's output length, and the
                        // pairs of row j belong to this task alone.
                        unsafe { *job.out.0.add(p.outs[i] as usize) = v };
                    }
                    q += m;
                }
            }
        }
    };
    for_each_chunk(n_chunks, task);
}

/// The pairs of the union's rows `range` with row-gather kernels: each token's pairs go out
/// [`MR`] rows at a time, rows in order (each pair computed once, as independent chains; a
/// token's rows are read again from cache, a few rows after the first token needing them).
fn gather_by_token(
    jobs: &[GatherJob],
    p: &Pairs,
    range: std::ops::Range<usize>,
    n_tokens: usize,
    prefetch_to: &mut impl FnMut(usize),
) {
    // per token, up to MR pending (row, pair) entries
    let mut pending = vec![(0u32, 0u32); n_tokens * MR];
    let mut len = vec![0usize; n_tokens];
    let mut tile = [0f32; MR * NT];
    let mut flush = |t: usize, entries: &[(u32, u32)]| {
        for job in jobs {
            let rb = job.w.row_bytes();
            let rows: [*const u8; MR] = std::array::from_fn(|k| {
                let r = entries[k.min(entries.len() - 1)].0 as usize;
                job.w.data[r * rb..(r + 1) * rb].as_ptr()
            });
            let kernel = job
                .rows
                .expect("by_token: every job has a row-gather kernel");
            // SAFETY: each address is a whole row of the job's matrix, t < n_tokens is a token
            // of its activations and the tile holds MR × NT values.
            unsafe { kernel(&rows[..entries.len()], job.acts, t, job.w.cols, &mut tile) };
            for (k, &(_, i)) in entries.iter().enumerate() {
                // SAFETY: outs are distinct positions < the job's output length, and the pairs
                // of this task's rows belong to it alone.
                unsafe { *job.out.0.add(p.outs[i as usize] as usize) = tile[k * NT] };
            }
        }
    };
    for j in range {
        prefetch_to(j);
        let r = p.rows[j];
        for i in p.start[j]..p.start[j + 1] {
            let t = p.toks[i as usize] as usize;
            pending[t * MR + len[t]] = (r, i);
            len[t] += 1;
            if len[t] == MR {
                flush(t, &pending[t * MR..(t + 1) * MR]);
                len[t] = 0;
            }
        }
    }
    for (t, &l) in len.iter().enumerate() {
        if l > 0 {
            flush(t, &pending[t * MR..t * MR + l]);
        }
    }
}

/// Prefetches weight row `r` (of `rb` bytes).
#[inline]
fn prefetch_row(w: &Matrix, r: u32, rb: usize) {
    let base = r as usize * rb;
    for off in (0..rb).step_by(64) {
        prefetch(&w.data[base + off]);
    }
}

/// Gathered rows per task: enough tasks for load balance (8 per thread), each at least ~16 KiB of
/// weights, and for batches at most ~64 KiB so that a task's rows stay in cache while it sweeps
/// the tokens.
fn gather_chunk(n: usize, rb: usize, n_tokens: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let min_rows = (16 * 1024 / rb.max(1)).max(MR);
    let mut chunk = n.div_ceil(threads * 8).max(min_rows);
    if n_tokens > 1 {
        chunk = chunk.min((64 * 1024 / rb.max(1)).max(MR));
    }
    chunk
}

/// Runs `task` on `0..n_chunks`: in parallel on the current rayon pool, or inline when there is
/// one chunk or one thread.
fn for_each_chunk(n_chunks: usize, task: impl Fn(usize) + Send + Sync) {
    if n_chunks == 1 || rayon::current_num_threads() <= 1 {
        (0..n_chunks).for_each(task);
    } else {
        (0..n_chunks).into_par_iter().for_each(task);
    }
}

/// For each token `t`, `out[t*cols..(t+1)*cols] += Σ_{i : a[t*rows+i] ≠ 0} a[t*rows+i] · row_i(w_t)`
/// with `rows = w_t.rows` (neurons, `n_ff`) and `cols = w_t.cols` (`n_embd`).
///
/// `w_t` is the down projection stored transposed (neuron-major), so that each neuron's column is
/// a contiguous row. Zero coefficients (`0.0` and `-0.0`) are skipped: their rows are not read,
/// so they cannot contribute NaNs or infinities. For a batch, the rows of the union of the tokens'
/// active neurons are each read once. Deterministic: identical bits at every thread count and on
/// every SIMD path (see the module docs). Any weight type of [`Matrix`] is accepted; F32, F16,
/// BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 have SIMD kernels, the K-quants a scalar one.
///
/// Errors: [`Error::InvalidArgument`] for a malformed matrix or wrong `a`/`out` lengths.
pub fn sparse_axpy(w_t: &Matrix, a: &[f32], n_tokens: usize, out: &mut [f32]) -> Result<()> {
    sparse_axpy_at(Level::current(), w_t, a, n_tokens, out)
}

/// The active neurons of a call in compressed form: neuron `neurons[j]` is needed by the tokens
/// `toks[start[j]..start[j+1]]` with the coefficients `coefs[..]` at the same positions.
#[derive(Default)]
struct Active {
    neurons: Vec<u32>,
    start: Vec<u32>,
    toks: Vec<u32>,
    coefs: Vec<f32>,
    /// For a batch with a grouped kernel, the steps of each group of [`GROUP`] listed neurons (group
    /// `q` is `plans[plan_start[q]..plan_start[q + 1]]`), built once and shared by every task.
    plans: Vec<Step>,
    plan_start: Vec<u32>,
    /// Scratch counts of [`Active::build`] (per neuron) and [`Active::build_plans`] (per token).
    count: Vec<u32>,
    /// Scratch of [`Active::build`] for a batch: per token, a bit per neuron with a non-zero
    /// coefficient (64 neurons per word).
    mask: Vec<u64>,
}

/// Calls `f(t, i)` for every set bit `i` of each token `t`'s `words` mask words, in order.
fn for_each_set_bit(mask: &[u64], words: usize, mut f: impl FnMut(usize, usize)) {
    for (t, token) in mask.chunks_exact(words).enumerate() {
        for (w, &word) in token.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                f(t, w * 64 + bits.trailing_zeros() as usize);
                bits &= bits - 1;
            }
        }
    }
}

impl Active {
    fn build(&mut self, a: &[f32], rows: usize, n_tokens: usize) {
        self.neurons.clear();
        self.start.clear();
        self.toks.clear();
        self.coefs.clear();
        if n_tokens == 1 {
            // one token: every listed neuron has the one coefficient, at position j
            for (i, &v) in a.iter().enumerate() {
                if v != 0.0 {
                    self.neurons.push(i as u32);
                    self.coefs.push(v);
                }
            }
            self.start.extend(0..=self.neurons.len() as u32);
            self.toks.resize(self.neurons.len(), 0);
            return;
        }
        // a batch: a bit mask of each token's non-zero coefficients (branch-free), then each
        // neuron's token count from the set bits, the listed neurons and where their pairs start,
        // and each token's pairs placed token after token (each neuron's tokens ascending)
        let words = rows.div_ceil(64);
        self.mask.clear();
        for row in a.chunks_exact(rows) {
            self.mask.extend(row.chunks(64).map(|c| {
                c.iter()
                    .enumerate()
                    .fold(0u64, |m, (k, &v)| m | (u64::from(v != 0.0) << k))
            }));
        }
        self.count.clear();
        self.count.resize(rows, 0);
        for_each_set_bit(&self.mask, words, |_, i| self.count[i] += 1);
        let mut pos = 0u32;
        for (i, c) in self.count.iter_mut().enumerate() {
            if *c > 0 {
                self.neurons.push(i as u32);
                self.start.push(pos);
                (pos, *c) = (pos + *c, pos);
            }
        }
        self.start.push(pos);
        self.toks.resize(pos as usize, 0);
        self.coefs.resize(pos as usize, 0.0);
        let (count, toks, coefs) = (&mut self.count, &mut self.toks, &mut self.coefs);
        for_each_set_bit(&self.mask, words, |t, i| {
            let p = count[i] as usize;
            count[i] += 1;
            toks[p] = t as u32;
            coefs[p] = a[t * rows + i];
        });
    }

    /// Fills `plans`: for each group of [`GROUP`] listed neurons, its (token, neuron) pairs
    /// ordered by token, then neuron (each token's fused multiply-adds in the neuron order of
    /// [`AxpyKernel`] calls): a counting sort of the group's pairs by token.
    fn build_plans(&mut self, n_tokens: usize) {
        self.plans.clear();
        self.plan_start.clear();
        let filler = Step {
            tok: 0,
            j: 0,
            coef: 0.0,
        };
        for j0 in (0..self.neurons.len()).step_by(GROUP) {
            let g = (self.neurons.len() - j0).min(GROUP);
            let (s, e) = (self.start[j0] as usize, self.start[j0 + g] as usize);
            let first = self.plans.len();
            self.plan_start.push(first as u32);
            self.count.clear();
            self.count.resize(n_tokens + 1, 0);
            for &t in &self.toks[s..e] {
                self.count[t as usize + 1] += 1;
            }
            for t in 1..=n_tokens {
                self.count[t] += self.count[t - 1];
            }
            self.plans.resize(first + (e - s), filler);
            for k in 0..g {
                let (ks, ke) = (self.start[j0 + k] as usize, self.start[j0 + k + 1] as usize);
                for p in ks..ke {
                    let tok = self.toks[p];
                    let at = &mut self.count[tok as usize];
                    self.plans[first + *at as usize] = Step {
                        tok,
                        j: k as u32,
                        coef: self.coefs[p],
                    };
                    *at += 1;
                }
            }
        }
        self.plan_start.push(self.plans.len() as u32);
    }

    /// The steps of group `q` (listed neurons `q * GROUP..`), see [`Active::build_plans`].
    fn plan(&self, q: usize) -> &[Step] {
        &self.plans[self.plan_start[q] as usize..self.plan_start[q + 1] as usize]
    }
}

/// One step of a grouped batched kernel: token `tok`'s output += `coef` × the group's neuron `j`.
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct Step {
    tok: u32,
    j: u32,
    coef: f32,
}

thread_local! {
    /// Reused active-neuron lists (taken out during a call, so nested calls just allocate).
    static ACTIVE: std::cell::Cell<Option<Box<Active>>> = const { std::cell::Cell::new(None) };
}

/// An axpy kernel: with `seg` the blocks of `n` consecutive elements of one weight row (starting
/// at a column that is a multiple of 32 and of the block size), does
/// `out[toks[j] * stride + e] = fma(coefs[j], w[e], out[toks[j] * stride + e])` for every `j` and
/// `e < n`, `e` innermost per block and `j` in order.
///
/// # Safety
/// `seg` must hold the blocks of `n` elements; every `out + toks[j] * stride .. + n` must be
/// valid for reads and writes and not accessed concurrently; the CPU must have the kernel's ISA.
pub(super) type AxpyKernel = unsafe fn(
    ty: GgmlType,
    seg: *const u8,
    n: usize,
    coefs: &[f32],
    toks: &[u32],
    out: *mut f32,
    stride: usize,
);

/// A single-token axpy kernel over several neurons at once: for each tile of columns (a few
/// 32-element groups), loads the output once into registers, does `out = fma(coefs[j], w_j, out)`
/// for `j` in order, and stores it (the same operations in the same order as one [`AxpyKernel`]
/// call per neuron, so the same bits).
///
/// # Safety
/// As [`AxpyKernel`], for every `segs[j]` and `out .. out + n`.
type Axpy1Kernel =
    unsafe fn(ty: GgmlType, segs: &[*const u8], coefs: &[f32], n: usize, out: *mut f32);

/// A batched axpy kernel over a group of neurons at once: for each tile of columns, decodes the
/// group's segments once into a buffer, then for each token of `plan` loads its output tile, does
/// its steps' `out = fma(coef, w_j, out)` in order and stores it (per output element, the same
/// operations in the same order as one [`AxpyKernel`] call per neuron, so the same bits).
///
/// # Safety
/// As [`AxpyKernel`], for every `segs[j]` and every step's token's `out + tok * stride .. + n`;
/// every step's `j < segs.len()`.
type AxpyNKernel = unsafe fn(
    ty: GgmlType,
    segs: &[*const u8],
    plan: &[Step],
    n: usize,
    out: *mut f32,
    stride: usize,
);

/// The grouped batched kernel for `ty` on `level`, where there is one.
fn axpy_kernel_n(level: Level, ty: GgmlType) -> Option<AxpyNKernel> {
    #[cfg(target_arch = "x86_64")]
    if level >= Level::Avx512 {
        return x86::avx512_kernel_n(ty);
    }
    let _ = (level, ty);
    None
}

/// Neurons per [`Axpy1Kernel`] or [`AxpyNKernel`] call.
const GROUP: usize = 8;

/// The single-token kernel for `ty` on `level`, where there is one.
fn axpy_kernel1(level: Level, ty: GgmlType) -> Option<Axpy1Kernel> {
    #[cfg(target_arch = "x86_64")]
    {
        if level >= Level::Avx512 {
            if let Some(k) = x86::avx512_kernel1(ty) {
                return Some(k);
            }
        }
        if level >= Level::Avx2 {
            if let Some(k) = x86::avx2_kernel1(ty) {
                return Some(k);
            }
        }
    }
    let _ = (level, ty);
    None
}

/// The axpy kernel for `ty` on `level`.
fn axpy_kernel(level: Level, ty: GgmlType) -> AxpyKernel {
    #[cfg(target_arch = "x86_64")]
    {
        if level >= Level::Avx512 {
            if let Some(k) = x86::avx512_kernel(ty) {
                return k;
            }
        }
        if level >= Level::Avx2 {
            if let Some(k) = x86::avx2_kernel(ty) {
                return k;
            }
        }
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if level == Level::Simd128 {
        if let Some(k) = super::simd128::axpy_kernel(ty) {
            return k;
        }
    }
    let _ = (level, ty);
    axpy_scalar
}

/// Elements per step of the kernels (and the alignment of the column ranges): a block, and at
/// least 32 for the float formats.
fn granule(ty: GgmlType) -> usize {
    ty.block_size().max(QK)
}

/// The portable kernel (any dequantisable type): dequantises a granule at a time into a buffer.
pub(super) unsafe fn axpy_scalar(
    ty: GgmlType,
    seg: *const u8,
    n: usize,
    coefs: &[f32],
    toks: &[u32],
    out: *mut f32,
    stride: usize,
) {
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    let step = granule(ty);
    let mut buf = [0f32; 256];
    let mut e = 0;
    while e < n {
        let m = step.min(n - e);
        // SAFETY: the caller guarantees the blocks of n elements at seg.
        let src = unsafe { std::slice::from_raw_parts(seg.add(e / bs * bb), m / bs * bb) };
        crate::quant::dequantize(ty, src, &mut buf[..m])
            .expect("matrix types are dequantisable and segments whole blocks");
        for (&c, &t) in coefs.iter().zip(toks) {
            // SAFETY: the caller guarantees out + t * stride .. + n is this task's to write.
            let o = unsafe { std::slice::from_raw_parts_mut(out.add(t as usize * stride + e), m) };
            for (o, &w) in o.iter_mut().zip(&buf[..m]) {
                *o = c.mul_add(w, *o);
            }
        }
        e += m;
    }
}

/// [`sparse_axpy`] on `level`.
pub(crate) fn sparse_axpy_at(
    level: Level,
    w_t: &Matrix,
    a: &[f32],
    n_tokens: usize,
    out: &mut [f32],
) -> Result<()> {
    w_t.validate()?;
    let (rows, cols, ty) = (w_t.rows, w_t.cols, w_t.ty);
    if !crate::quant::can_dequantize(ty) {
        return Err(Error::UnsupportedType {
            ty: ty.name(),
            op: "sparse_axpy",
        });
    }
    if n_tokens.checked_mul(rows) != Some(a.len()) {
        return Err(Error::InvalidArgument(format!(
            "a has {} values, expected {n_tokens} tokens × {rows} neurons",
            a.len()
        )));
    }
    if n_tokens.checked_mul(cols) != Some(out.len()) {
        return Err(Error::InvalidArgument(format!(
            "out has {} values, expected {n_tokens} tokens × {cols} columns",
            out.len()
        )));
    }
    if n_tokens == 0 || rows == 0 || cols == 0 {
        return Ok(());
    }
    let mut act = ACTIVE.with(|s| s.take()).unwrap_or_default();
    act.build(a, rows, n_tokens);
    if !act.neurons.is_empty() {
        let (k1, kn) = if n_tokens == 1 {
            (axpy_kernel1(level, ty), None)
        } else {
            (None, axpy_kernel_n(level, ty))
        };
        if kn.is_some() {
            act.build_plans(n_tokens);
        }
        let kernels = Kernels {
            one: axpy_kernel(level, ty),
            single: k1,
            group: kn,
        };
        run_axpy(kernels, w_t, &act, n_tokens, out);
    }
    ACTIVE.with(|s| s.set(Some(act)));
    Ok(())
}

/// The kernels of a call: per neuron, and (where there is one) over groups of neurons for one
/// token or for a batch.
#[derive(Clone, Copy)]
struct Kernels {
    one: AxpyKernel,
    single: Option<Axpy1Kernel>,
    group: Option<AxpyNKernel>,
}

/// Bytes at the start of each upcoming row segment that [`run_axpy`] prefetches. A short segment
/// (a ReLU model's down rows) is prefetched whole; of a long one (TEAL's input-major copies of a
/// 7B model: 11 KB and more per task) only its head, to start the stream that the hardware
/// prefetcher and the kernels' own [`SEGMENT_AHEAD`](x86) prefetches then follow: prefetching
/// every line of long segments here stalled the core (F16 Llama-2-7B-shaped layers, TEAL 50%: 62
/// → 45 ms per token into L1; into L2, 27.7 → 32.5 ms).
const PREFETCH_SEGMENT_HEAD: usize = 512;

/// Splits the columns into ranges (whole granules) and walks all active neurons in each.
fn run_axpy(kernels: Kernels, w: &Matrix, act: &Active, n_tokens: usize, out: &mut [f32]) {
    let (cols, ty) = (w.cols, w.ty);
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    let rb = w.row_bytes();
    let g = granule(ty);
    let n_gran = cols.div_ceil(g);
    let threads = rayon::current_num_threads().max(1);
    // granules per task, each at least 256 columns: for one token, one column range per thread
    // (the work per column is uniform, and each task reads its part of every active row, so
    // narrower ranges only cut the rows into more, partly wasted, cache lines); for a batch,
    // several tasks per thread whose tokens' output segments stay within ~128 KiB
    let min_per = 256usize.div_ceil(g);
    let per = if n_tokens == 1 {
        n_gran.div_ceil(threads).max(min_per)
    } else {
        let per = n_gran.div_ceil(threads * 4).max(min_per);
        per.min((32 * 1024 / (n_tokens * g)).max(1))
    };
    let n_chunks = n_gran.div_ceil(per);
    let optr = OutPtr(out.as_mut_ptr());

    let task = move |c: usize| {
        let optr = optr;
        let c0 = c * per * g;
        let c1 = ((c + 1) * per * g).min(cols);
        let seg_off = c0 / bs * bb;
        let seg_bytes = (c1 - c0).div_ceil(bs) * bb;
        let ahead = (PREFETCH_AHEAD / seg_bytes.max(1)).clamp(2, 64);
        let nn = act.neurons.len();
        let mut pf = 0;
        let mut prefetch_to = |end: usize| {
            while pf < nn && pf < end {
                prefetch_segment(w, act.neurons[pf], seg_off, seg_bytes);
                pf += 1;
            }
        };
        let group_segs = |j: usize, g: usize| {
            let mut segs = [std::ptr::null::<u8>(); GROUP];
            for (s, &i) in segs.iter_mut().zip(&act.neurons[j..j + g]) {
                *s = w.data[i as usize * rb + seg_off..][..seg_bytes].as_ptr();
            }
            segs
        };
        if let Some(kn) = kernels.group {
            let mut j = 0;
            while j < nn {
                let g = (nn - j).min(GROUP);
                prefetch_to(j + g + ahead);
                let segs = group_segs(j, g);
                let plan = act.plan(j / GROUP);
                // SAFETY: as below, for each of the g segments; the plan's tokens are < n_tokens
                // and its j < g.
                unsafe { kn(ty, &segs[..g], plan, c1 - c0, optr.0.add(c0), cols) };
                j += g;
            }
            return;
        }
        if let Some(k1) = kernels.single {
            // one token: start[j] == j, so the coefficients are act.coefs[j]
            // SAFETY: columns c0..c1 of out belong to this task alone.
            unsafe { axpy1_range(k1, w, &act.neurons, &act.coefs, c0..c1, optr.0.add(c0)) };
            return;
        }
        for j in 0..nn {
            prefetch_to(j + 1 + ahead);
            let seg = &w.data[act.neurons[j] as usize * rb + seg_off..][..seg_bytes];
            let (s, e) = (act.start[j] as usize, act.start[j + 1] as usize);
            // SAFETY: seg holds the blocks of columns c0..c1; each token's columns c0..c1 of out
            // are in bounds (toks < n_tokens) and belong to this task alone; the kernel was
            // selected for this CPU.
            unsafe {
                (kernels.one)(
                    ty,
                    seg.as_ptr(),
                    c1 - c0,
                    &act.coefs[s..e],
                    &act.toks[s..e],
                    optr.0.add(c0),
                    cols,
                )
            };
        }
    };
    for_each_chunk(n_chunks, task);
}

/// Prefetches the segment (`seg_bytes` from `seg_off`) of row `row` of `w`: whole when it is
/// short, else its head (see [`PREFETCH_SEGMENT_HEAD`]).
fn prefetch_segment(w: &Matrix, row: u32, seg_off: usize, seg_bytes: usize) {
    let base = row as usize * w.row_bytes() + seg_off;
    for off in (0..seg_bytes.min(PREFETCH_SEGMENT_HEAD)).step_by(64) {
        prefetch(&w.data[base + off]);
    }
    if seg_bytes <= PREFETCH_SEGMENT_HEAD {
        prefetch(&w.data[base + seg_bytes - 1]);
    }
}

/// `out[c - c0] += Σ_j coefs[j] · w_t[neurons[j]][c]` for the columns `cols` (whole granules, or
/// up to the end) with a single-token kernel, [`GROUP`] neurons per call in order, prefetching
/// the rows' segments ahead.
///
/// # Safety
/// `out` must point to `cols.len()` writable values no one else accesses; `neurons` must be rows
/// of `w` and as many as `coefs`.
unsafe fn axpy1_range(
    k1: Axpy1Kernel,
    w: &Matrix,
    neurons: &[u32],
    coefs: &[f32],
    cols: std::ops::Range<usize>,
    out: *mut f32,
) {
    let (ty, rb) = (w.ty, w.row_bytes());
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    let seg_off = cols.start / bs * bb;
    let seg_bytes = cols.len().div_ceil(bs) * bb;
    let ahead = (PREFETCH_AHEAD / seg_bytes.max(1)).clamp(2, 64);
    let nn = neurons.len();
    let mut pf = 0;
    let mut j = 0;
    while j < nn {
        let g = (nn - j).min(GROUP);
        while pf < nn && pf < j + g + ahead {
            prefetch_segment(w, neurons[pf], seg_off, seg_bytes);
            pf += 1;
        }
        let mut segs = [std::ptr::null::<u8>(); GROUP];
        for (s, &i) in segs.iter_mut().zip(&neurons[j..j + g]) {
            *s = w.data[i as usize * rb + seg_off..][..seg_bytes].as_ptr();
        }
        // SAFETY: each segment holds the blocks of the columns; out is the caller's.
        unsafe { k1(ty, &segs[..g], &coefs[j..j + g], cols.len(), out) };
        j += g;
    }
}

/// One token's `out[c] += Σ_j coefs[j] · w_t[neurons[j]][c]` over every column, on this thread:
/// [`sparse_axpy`] restricted to the listed neurons (non-zero coefficients, ascending), with its
/// bits (each output is the same chain of fused multiply-adds in neuron order).
pub(crate) fn axpy_rows_serial(
    level: Level,
    w_t: &Matrix,
    neurons: &[u32],
    coefs: &[f32],
    out: &mut [f32],
) {
    assert!(neurons.len() == coefs.len() && out.len() == w_t.cols);
    assert!(neurons.iter().all(|&i| (i as usize) < w_t.rows));
    let cols = 0..w_t.cols;
    if let Some(k1) = axpy_kernel1(level, w_t.ty) {
        // SAFETY: out holds every column, and the neurons are rows of w_t.
        unsafe { axpy1_range(k1, w_t, neurons, coefs, cols, out.as_mut_ptr()) };
        return;
    }
    let (one, rb) = (axpy_kernel(level, w_t.ty), w_t.row_bytes());
    for (&i, &c) in neurons.iter().zip(coefs) {
        let seg = &w_t.data[i as usize * rb..][..rb];
        // SAFETY: seg is a whole row; out holds its columns for the one token 0.
        unsafe {
            one(
                w_t.ty,
                seg.as_ptr(),
                w_t.cols,
                &[c],
                &[0],
                out.as_mut_ptr(),
                w_t.cols,
            )
        };
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! AVX2/FMA and AVX-512 axpy kernels: each 32-element group is decoded to exact f32 values in
    //! registers once, then fused-multiply-added into every token's output.

    use std::arch::x86_64::*;

    use crate::quant::{GgmlType, QK};

    use super::{axpy_scalar, Axpy1Kernel, AxpyKernel, AxpyNKernel, Step, GROUP};

    /// The f16 at `p` as f32 (F16C, exact, as [`crate::quant::fp16_to_fp32`]).
    #[inline(always)]
    unsafe fn f16_at(p: *const u8) -> f32 {
        let h = (p as *const u16).read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
    }

    /// A format as the kernels see it: 32 elements (one block, or 32 float values) at a time.
    trait Fmt {
        /// Bytes per 32 elements.
        const BB: usize;
        /// AVX2: the 32 values as 4 × 8 f32.
        unsafe fn dec8(p: *const u8) -> [__m256; 4];
        /// AVX-512: the 32 values as 2 × 16 f32.
        unsafe fn dec16(p: *const u8) -> [__m512; 2];
    }

    /// The 16 quant bytes at `q` → (low nibbles, high nibbles): elements 0..16 and 16..32.
    #[inline(always)]
    unsafe fn nibbles(q: *const u8) -> (__m128i, __m128i) {
        let v = _mm_loadu_si128(q as *const __m128i);
        let m = _mm_set1_epi8(0x0F);
        (
            _mm_and_si128(v, m),
            _mm_and_si128(_mm_srli_epi16::<4>(v), m),
        )
    }

    /// Bytes `0x10` where bit `i` of the 16 bits `h` is set, `0` elsewhere.
    #[inline(always)]
    unsafe fn high_bits(h: u32) -> __m128i {
        let v = _mm_set1_epi16(h as u16 as i16);
        let idx = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        let bytes = _mm_shuffle_epi8(v, idx);
        let bit = _mm_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
        let set = _mm_cmpeq_epi8(_mm_or_si128(bytes, bit), _mm_set1_epi8(-1));
        _mm_and_si128(set, _mm_set1_epi8(0x10))
    }

    /// 16 signed bytes × `d` (+ `m`) as 2 × 8 f32 (exact: |q| < 2^8, d an f16).
    #[inline(always)]
    unsafe fn scale8(q: __m128i, d: __m256, m: Option<__m256>) -> [__m256; 2] {
        let a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
        let b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(q)));
        match m {
            None => [_mm256_mul_ps(a, d), _mm256_mul_ps(b, d)],
            Some(m) => [_mm256_fmadd_ps(a, d, m), _mm256_fmadd_ps(b, d, m)],
        }
    }

    #[inline(always)]
    unsafe fn scale16(q: __m128i, d: __m512, m: Option<__m512>) -> __m512 {
        let a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
        match m {
            None => _mm512_mul_ps(a, d),
            Some(m) => _mm512_fmadd_ps(a, d, m),
        }
    }

    /// Quant bytes of a 32-block as (elements 0..16, 16..32), scale and optional min.
    trait Quant32 {
        const BB: usize;
        unsafe fn quants(p: *const u8) -> (__m128i, __m128i, f32, Option<f32>);
    }

    /// The AVX2 decoding of a [`Quant32`] block: its quants × scale (+ min) as 4 × 8 f32.
    #[inline(always)]
    unsafe fn quant_dec8<Q: Quant32>(p: *const u8) -> [__m256; 4] {
        let (lo, hi, d, m) = Q::quants(p);
        let (d, m) = (_mm256_set1_ps(d), m.map(|m| _mm256_set1_ps(m)));
        let [a, b] = scale8(lo, d, m);
        let [c, e] = scale8(hi, d, m);
        [a, b, c, e]
    }

    impl<Q: Quant32> Fmt for Q {
        const BB: usize = <Q as Quant32>::BB;
        #[inline(always)]
        unsafe fn dec8(p: *const u8) -> [__m256; 4] {
            quant_dec8::<Q>(p)
        }
        #[inline(always)]
        unsafe fn dec16(p: *const u8) -> [__m512; 2] {
            let (lo, hi, d, m) = Q::quants(p);
            let (d, m) = (_mm512_set1_ps(d), m.map(|m| _mm512_set1_ps(m)));
            [scale16(lo, d, m), scale16(hi, d, m)]
        }
    }

    /// Q4_0's quants as a [`Quant32`] (for its AVX2 decoding).
    struct Q4_0Quants;
    impl Quant32 for Q4_0Quants {
        const BB: usize = 18;
        #[inline(always)]
        unsafe fn quants(p: *const u8) -> (__m128i, __m128i, f32, Option<f32>) {
            let (lo, hi) = nibbles(p.add(2));
            let o = _mm_set1_epi8(8);
            (_mm_sub_epi8(lo, o), _mm_sub_epi8(hi, o), f16_at(p), None)
        }
    }

    struct Q4_0;
    impl Fmt for Q4_0 {
        const BB: usize = 18;
        #[inline(always)]
        unsafe fn dec8(p: *const u8) -> [__m256; 4] {
            quant_dec8::<Q4_0Quants>(p)
        }
        /// A 16-entry table of the block's values `(q - 8) · d` (exact: 4 × 11 significant bits),
        /// looked up by each element's nibble (`vpermps` reads the low 4 bits of each lane), so the
        /// 32 values cost one multiply, one widening and two permutes instead of widening,
        /// converting and scaling each half.
        #[inline(always)]
        unsafe fn dec16(p: *const u8) -> [__m512; 2] {
            let q = _mm512_setr_ps(
                -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0,
                7.0,
            );
            let table = _mm512_mul_ps(q, _mm512_set1_ps(f16_at(p)));
            let idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(2) as *const __m128i));
            [
                _mm512_permutexvar_ps(idx, table),
                _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(idx), table),
            ]
        }
    }

    struct Q4_1;
    impl Quant32 for Q4_1 {
        const BB: usize = 20;
        #[inline(always)]
        unsafe fn quants(p: *const u8) -> (__m128i, __m128i, f32, Option<f32>) {
            let (lo, hi) = nibbles(p.add(4));
            (lo, hi, f16_at(p), Some(f16_at(p.add(2))))
        }
    }

    struct Q5_0;
    impl Quant32 for Q5_0 {
        const BB: usize = 22;
        #[inline(always)]
        unsafe fn quants(p: *const u8) -> (__m128i, __m128i, f32, Option<f32>) {
            let qh = (p.add(2) as *const u32).read_unaligned();
            let (lo, hi) = nibbles(p.add(6));
            let o = _mm_set1_epi8(16);
            let lo = _mm_sub_epi8(_mm_or_si128(lo, high_bits(qh)), o);
            let hi = _mm_sub_epi8(_mm_or_si128(hi, high_bits(qh >> 16)), o);
            (lo, hi, f16_at(p), None)
        }
    }

    struct Q5_1;
    impl Quant32 for Q5_1 {
        const BB: usize = 24;
        #[inline(always)]
        unsafe fn quants(p: *const u8) -> (__m128i, __m128i, f32, Option<f32>) {
            let qh = (p.add(4) as *const u32).read_unaligned();
            let (lo, hi) = nibbles(p.add(8));
            let lo = _mm_or_si128(lo, high_bits(qh));
            let hi = _mm_or_si128(hi, high_bits(qh >> 16));
            (lo, hi, f16_at(p), Some(f16_at(p.add(2))))
        }
    }

    struct Q8_0;
    impl Quant32 for Q8_0 {
        const BB: usize = 34;
        #[inline(always)]
        unsafe fn quants(p: *const u8) -> (__m128i, __m128i, f32, Option<f32>) {
            let lo = _mm_loadu_si128(p.add(2) as *const __m128i);
            let hi = _mm_loadu_si128(p.add(18) as *const __m128i);
            (lo, hi, f16_at(p), None)
        }
    }

    struct F32;
    impl Fmt for F32 {
        const BB: usize = 128;
        #[inline(always)]
        unsafe fn dec8(p: *const u8) -> [__m256; 4] {
            let p = p as *const f32;
            [0, 8, 16, 24].map(|i| _mm256_loadu_ps(p.add(i)))
        }
        #[inline(always)]
        unsafe fn dec16(p: *const u8) -> [__m512; 2] {
            let p = p as *const f32;
            [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))]
        }
    }

    struct F16;
    impl Fmt for F16 {
        const BB: usize = 64;
        #[inline(always)]
        unsafe fn dec8(p: *const u8) -> [__m256; 4] {
            [0, 16, 32, 48].map(|i| _mm256_cvtph_ps(_mm_loadu_si128(p.add(i) as *const __m128i)))
        }
        #[inline(always)]
        unsafe fn dec16(p: *const u8) -> [__m512; 2] {
            [0, 32].map(|i| _mm512_cvtph_ps(_mm256_loadu_si256(p.add(i) as *const __m256i)))
        }
    }

    struct Bf16;
    impl Fmt for Bf16 {
        const BB: usize = 64;
        #[inline(always)]
        unsafe fn dec8(p: *const u8) -> [__m256; 4] {
            [0, 16, 32, 48].map(|i| {
                let v = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(i) as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v))
            })
        }
        #[inline(always)]
        unsafe fn dec16(p: *const u8) -> [__m512; 2] {
            [0, 32].map(|i| {
                let v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.add(i) as *const __m256i));
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v))
            })
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn axpy_avx2<F: Fmt>(
        ty: GgmlType,
        seg: *const u8,
        n: usize,
        coefs: &[f32],
        toks: &[u32],
        out: *mut f32,
        stride: usize,
    ) {
        let nblk = n / QK;
        for b in 0..nblk {
            let w = F::dec8(seg.add(b * F::BB));
            for (&c, &t) in coefs.iter().zip(toks) {
                let o = out.add(t as usize * stride + b * QK);
                let c = _mm256_set1_ps(c);
                for (v, &w) in w.iter().enumerate() {
                    let p = o.add(8 * v);
                    _mm256_storeu_ps(p, _mm256_fmadd_ps(c, w, _mm256_loadu_ps(p)));
                }
            }
        }
        if nblk * QK < n {
            // the float formats' last < 32 values (the same fused multiply-adds, in scalar)
            let done = nblk * QK;
            axpy_scalar(
                ty,
                seg.add(nblk * F::BB),
                n - done,
                coefs,
                toks,
                out.add(done),
                stride,
            );
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn axpy_avx512<F: Fmt>(
        ty: GgmlType,
        seg: *const u8,
        n: usize,
        coefs: &[f32],
        toks: &[u32],
        out: *mut f32,
        stride: usize,
    ) {
        let nblk = n / QK;
        for b in 0..nblk {
            let [w0, w1] = F::dec16(seg.add(b * F::BB));
            for (&c, &t) in coefs.iter().zip(toks) {
                let o = out.add(t as usize * stride + b * QK);
                let c = _mm512_set1_ps(c);
                _mm512_storeu_ps(o, _mm512_fmadd_ps(c, w0, _mm512_loadu_ps(o)));
                let o = o.add(16);
                _mm512_storeu_ps(o, _mm512_fmadd_ps(c, w1, _mm512_loadu_ps(o)));
            }
        }
        if nblk * QK < n {
            let done = nblk * QK;
            axpy_scalar(
                ty,
                seg.add(nblk * F::BB),
                n - done,
                coefs,
                toks,
                out.add(done),
                stride,
            );
        }
    }

    /// 32-element blocks per output tile of the single-token kernels: the tile's accumulators
    /// stay in registers while every neuron of the group is added into them, giving independent
    /// fused multiply-add chains to overlap. AVX2: 2 blocks (8 of its 16 registers).
    const TILE8: usize = 2;
    /// AVX-512: 4 blocks (8 of its 32 registers).
    const TILE16: usize = 4;

    /// Bytes ahead of the current tile that the single-token kernels prefetch in each segment.
    /// TEAL's input-major rows are long (kilobytes per task); without it they streamed from DRAM
    /// at 0.7 of the dense matmul's pace (F16 TEAL 50% on Llama-2-7B-shaped layers: 42–45 →
    /// 37–38.5 ms per token for four layers with 512–1024 bytes ahead into L1; 32.8 into L2,
    /// where 2–4 KiB ahead did no better). Segments shorter than this (a ReLU model's down rows)
    /// get none here: [`super::run_axpy`] prefetches them whole.
    const SEGMENT_AHEAD: usize = 1024;

    /// Prefetches the `len` bytes at `SEGMENT_AHEAD` past byte `at` of every segment, stopping at
    /// the segment's `end`, one line at a time.
    #[inline(always)]
    unsafe fn prefetch_ahead(segs: &[*const u8], at: usize, len: usize, end: usize) {
        let from = at + SEGMENT_AHEAD;
        let to = (from + len).min(end);
        for &s in segs {
            let mut off = from;
            while off < to {
                super::super::prefetch_ptr(s.add(off));
                off += 64;
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn axpy1_avx2<F: Fmt>(
        ty: GgmlType,
        segs: &[*const u8],
        coefs: &[f32],
        n: usize,
        out: *mut f32,
    ) {
        let nblk = n / QK;
        let mut b = 0;
        while b + TILE8 <= nblk {
            prefetch_ahead(segs, b * F::BB, TILE8 * F::BB, nblk * F::BB);
            tile8::<F, TILE8>(segs, coefs, out, b);
            b += TILE8;
        }
        while b < nblk {
            tile8::<F, 1>(segs, coefs, out, b);
            b += 1;
        }
        tail1::<F>(ty, segs, coefs, n, out);
    }

    /// AVX2: blocks `b..b + T` of the output, every neuron of the group in order.
    #[inline(always)]
    unsafe fn tile8<F: Fmt, const T: usize>(
        segs: &[*const u8],
        coefs: &[f32],
        out: *mut f32,
        b: usize,
    ) {
        let o = out.add(b * QK);
        let mut acc = [[_mm256_setzero_ps(); 4]; T];
        for (t, acc) in acc.iter_mut().enumerate() {
            for (v, a) in acc.iter_mut().enumerate() {
                *a = _mm256_loadu_ps(o.add(t * QK + 8 * v));
            }
        }
        for (&s, &c) in segs.iter().zip(coefs) {
            let c = _mm256_set1_ps(c);
            let s = s.add(b * F::BB);
            for (t, acc) in acc.iter_mut().enumerate() {
                let w = F::dec8(s.add(t * F::BB));
                for v in 0..4 {
                    acc[v] = _mm256_fmadd_ps(c, w[v], acc[v]);
                }
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            for (v, &a) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.add(t * QK + 8 * v), a);
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn axpy1_avx512<F: Fmt>(
        ty: GgmlType,
        segs: &[*const u8],
        coefs: &[f32],
        n: usize,
        out: *mut f32,
    ) {
        let nblk = n / QK;
        let mut b = 0;
        while b + TILE16 <= nblk {
            prefetch_ahead(segs, b * F::BB, TILE16 * F::BB, nblk * F::BB);
            tile16::<F, TILE16>(segs, coefs, out, b);
            b += TILE16;
        }
        while b < nblk {
            tile16::<F, 1>(segs, coefs, out, b);
            b += 1;
        }
        tail1::<F>(ty, segs, coefs, n, out);
    }

    /// AVX-512: blocks `b..b + T` of the output, every neuron of the group in order.
    #[inline(always)]
    unsafe fn tile16<F: Fmt, const T: usize>(
        segs: &[*const u8],
        coefs: &[f32],
        out: *mut f32,
        b: usize,
    ) {
        let o = out.add(b * QK);
        let mut acc = [[_mm512_setzero_ps(); 2]; T];
        for (t, acc) in acc.iter_mut().enumerate() {
            *acc = [
                _mm512_loadu_ps(o.add(t * QK)),
                _mm512_loadu_ps(o.add(t * QK + 16)),
            ];
        }
        for (&s, &c) in segs.iter().zip(coefs) {
            let c = _mm512_set1_ps(c);
            let s = s.add(b * F::BB);
            for (t, acc) in acc.iter_mut().enumerate() {
                let [w0, w1] = F::dec16(s.add(t * F::BB));
                acc[0] = _mm512_fmadd_ps(c, w0, acc[0]);
                acc[1] = _mm512_fmadd_ps(c, w1, acc[1]);
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(o.add(t * QK), acc[0]);
            _mm512_storeu_ps(o.add(t * QK + 16), acc[1]);
        }
    }

    /// Blocks per column tile of the grouped batched kernel.
    const TILE_N: usize = 2;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn axpyn_avx512<F: Fmt>(
        ty: GgmlType,
        segs: &[*const u8],
        plan: &[Step],
        n: usize,
        out: *mut f32,
        stride: usize,
    ) {
        let nblk = n / QK;
        let mut b = 0;
        while b + TILE_N <= nblk {
            tilen16::<F, TILE_N>(segs, plan, out, stride, b);
            b += TILE_N;
        }
        while b < nblk {
            tilen16::<F, 1>(segs, plan, out, stride, b);
            b += 1;
        }
        let done = nblk * QK;
        if done < n {
            // the float formats' last < 32 values: each step in plan order (per token, the
            // neurons in order)
            for st in plan {
                axpy_scalar(
                    ty,
                    segs[st.j as usize].add(nblk * F::BB),
                    n - done,
                    &[st.coef],
                    &[st.tok],
                    out.add(done),
                    stride,
                );
            }
        }
    }

    /// AVX-512, batched: blocks `b..b + T` of the group's segments decoded once, then each token's
    /// steps of `plan` on its output tile.
    #[inline(always)]
    unsafe fn tilen16<F: Fmt, const T: usize>(
        segs: &[*const u8],
        plan: &[Step],
        out: *mut f32,
        stride: usize,
        b: usize,
    ) {
        let mut buf = [[[_mm512_setzero_ps(); 2]; T]; GROUP];
        for (w, &s) in buf.iter_mut().zip(segs) {
            let s = s.add(b * F::BB);
            for (t, w) in w.iter_mut().enumerate() {
                *w = F::dec16(s.add(t * F::BB));
            }
        }
        let mut i = 0;
        while i < plan.len() {
            let tok = plan[i].tok;
            let o = out.add(tok as usize * stride + b * QK);
            let mut acc = [[_mm512_setzero_ps(); 2]; T];
            for (t, acc) in acc.iter_mut().enumerate() {
                *acc = [
                    _mm512_loadu_ps(o.add(t * QK)),
                    _mm512_loadu_ps(o.add(t * QK + 16)),
                ];
            }
            while i < plan.len() && plan[i].tok == tok {
                let st = plan[i];
                let c = _mm512_set1_ps(st.coef);
                let w = &buf[st.j as usize];
                for (t, acc) in acc.iter_mut().enumerate() {
                    acc[0] = _mm512_fmadd_ps(c, w[t][0], acc[0]);
                    acc[1] = _mm512_fmadd_ps(c, w[t][1], acc[1]);
                }
                i += 1;
            }
            for (t, acc) in acc.iter().enumerate() {
                _mm512_storeu_ps(o.add(t * QK), acc[0]);
                _mm512_storeu_ps(o.add(t * QK + 16), acc[1]);
            }
        }
    }

    /// The grouped batched AVX-512 kernel for `ty`, if there is one.
    pub(super) fn avx512_kernel_n(ty: GgmlType) -> Option<AxpyNKernel> {
        use GgmlType as T;
        Some(match ty {
            T::F32 => axpyn_avx512::<F32>,
            T::F16 => axpyn_avx512::<F16>,
            T::BF16 => axpyn_avx512::<Bf16>,
            T::Q4_0 => axpyn_avx512::<Q4_0>,
            T::Q4_1 => axpyn_avx512::<Q4_1>,
            T::Q5_0 => axpyn_avx512::<Q5_0>,
            T::Q5_1 => axpyn_avx512::<Q5_1>,
            T::Q8_0 => axpyn_avx512::<Q8_0>,
            _ => return None,
        })
    }

    /// The float formats' last < 32 values of each segment, neuron by neuron.
    #[inline(always)]
    unsafe fn tail1<F: Fmt>(
        ty: GgmlType,
        segs: &[*const u8],
        coefs: &[f32],
        n: usize,
        out: *mut f32,
    ) {
        let done = n / QK * QK;
        if done < n {
            for (&s, &c) in segs.iter().zip(coefs) {
                axpy_scalar(
                    ty,
                    s.add(n / QK * F::BB),
                    n - done,
                    &[c],
                    &[0],
                    out.add(done),
                    0,
                );
            }
        }
    }

    /// `Some($kernel::<F>)` for the float or 32-element block format `F` of `$ty`, else `None`.
    macro_rules! by_format {
        ($ty:expr, $kernel:ident) => {{
            use GgmlType as T;
            Some(match $ty {
                T::F32 => $kernel::<F32>,
                T::F16 => $kernel::<F16>,
                T::BF16 => $kernel::<Bf16>,
                T::Q4_0 => $kernel::<Q4_0>,
                T::Q4_1 => $kernel::<Q4_1>,
                T::Q5_0 => $kernel::<Q5_0>,
                T::Q5_1 => $kernel::<Q5_1>,
                T::Q8_0 => $kernel::<Q8_0>,
                _ => return None,
            })
        }};
    }

    /// The single-token AVX2 kernel for `ty`, if there is one.
    pub(super) fn avx2_kernel1(ty: GgmlType) -> Option<Axpy1Kernel> {
        by_format!(ty, axpy1_avx2)
    }

    /// The single-token AVX-512 kernel for `ty`, if there is one.
    pub(super) fn avx512_kernel1(ty: GgmlType) -> Option<Axpy1Kernel> {
        by_format!(ty, axpy1_avx512)
    }

    /// The AVX2 kernel for `ty`, if there is one (needs AVX2, FMA, F16C).
    pub(super) fn avx2_kernel(ty: GgmlType) -> Option<AxpyKernel> {
        by_format!(ty, axpy_avx2)
    }

    /// The AVX-512 kernel for `ty`, if there is one (needs AVX-512 F/BW/VL, FMA, F16C).
    pub(super) fn avx512_kernel(ty: GgmlType) -> Option<AxpyKernel> {
        by_format!(ty, axpy_avx512)
    }
}

#[cfg(test)]
#[path = "sparse_tests.rs"]
mod tests;
