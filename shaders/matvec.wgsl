// Dense and gathered matrix × activation products, `y[t][k] = dot(W row r_k, x_t)`, one workgroup
// per output and token. The activations come quantised exactly as the CPU's `matmul` quantises them
// (Q8_0 quants and scales for Q4_0/Q5_0/Q8_0, Q8_K quants, scales and sums of 16 for the K-quants,
// f16-rounded floats for F16), and each block's integer dot product is scaled as ggml's
// `ggml_vec_dot_*` scales it; only the order of the float sum over blocks differs from the CPU.
// Needs f16.wgsl and bytes.wgsl.

// The weights' ggml type id: 0 F32, 1 F16, 2 Q4_0, 6 Q5_0, 8 Q8_0, 12 Q4_K, 14 Q6_K.
override WTYPE: u32 = 0u;
// Rows come from IDX (gather-matvec) instead of being consecutive (dense matvec).
override GATHER: bool = false;
// Applies relu to the outputs (the predictor's first layer).
override RELU: bool = false;
// Rounds the outputs to f16 (the input rounding of a following F16 matvec).
override ROUND_F16: bool = false;
// Dense rows whose word in IDX (indexed by the global row) is zero are skipped and output 0 (the
// neurons a predictor did not choose); IDX then holds one word per row of the matrix.
override MASK: bool = false;
// Invocations per workgroup (at most 256).
override WG: u32 = 64u;

struct Params {
    // Values per weight row (and per token of x).
    cols: u32,
    // Bytes per weight row.
    row_bytes: u32,
    // Outputs computed by this dispatch (per token).
    count: u32,
    // Outputs per token row of Y.
    y_stride: u32,
    // Where this dispatch's outputs start in a token row of Y.
    y_off: u32,
    // Gather: where this dispatch's indices start in IDX (dense: unused, rows are the chunk's).
    first: u32,
    // Gather: the global index of the chunk's first row (subtracted from IDX entries).
    row_base: u32,
    // Where this product's outputs start in Y (several products may share one buffer).
    y_base: u32,
}

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> XF: array<f32>;
@group(0) @binding(2) var<storage, read> XQ: array<u32>;
@group(0) @binding(3) var<storage, read> XD: array<f32>;
@group(0) @binding(4) var<storage, read> XB: array<i32>;
@group(0) @binding(5) var<storage, read> IDX: array<u32>;
@group(0) @binding(6) var<storage, read_write> Y: array<f32>;
@group(1) @binding(0) var<uniform> P: Params;

var<workgroup> partial: array<f32, 256>;

// Activation quant `i` (i8) of the flattened token rows.
fn xq(i: u32) -> i32 {
    return (i32(XQ[i >> 2u] << (24u - 8u * (i & 3u)))) >> 24u;
}

fn block_size() -> u32 {
    switch WTYPE {
        case 0u, 1u: { return 1u; }
        case 12u, 14u: { return 256u; }
        default: { return 32u; }
    }
}

fn block_bytes() -> u32 {
    switch WTYPE {
        case 0u: { return 4u; }
        case 1u: { return 2u; }
        case 2u: { return 18u; }
        case 6u: { return 22u; }
        case 8u: { return 34u; }
        case 12u: { return 144u; }
        default: { return 210u; }
    }
}

// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j of a Q4_K block at byte wb + 4.
fn scale_min_k4(sb: u32, j: u32) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(w_u8(sb + j) & 63u, w_u8(sb + j + 4u) & 63u);
    }
    let sc = (w_u8(sb + j + 4u) & 0xFu) | ((w_u8(sb + j - 4u) >> 6u) << 4u);
    let m = (w_u8(sb + j + 4u) >> 4u) | ((w_u8(sb + j) >> 6u) << 4u);
    return vec2<u32>(sc, m);
}

// The 6-bit quant (before the -32) at position p of the Q6_K block at byte wb.
fn q6(wb: u32, p: u32) -> i32 {
    let n = p / 128u;
    let r = p % 128u;
    let quarter = r / 32u;
    let l = r % 32u;
    let ql = wb + 64u * n;
    let qh = w_u8(wb + 128u + 32u * n + l);
    var lo: u32;
    switch quarter {
        case 0u: { lo = w_u8(ql + l) & 0xFu; }
        case 1u: { lo = w_u8(ql + l + 32u) & 0xFu; }
        case 2u: { lo = w_u8(ql + l) >> 4u; }
        default: { lo = w_u8(ql + l + 32u) >> 4u; }
    }
    return i32(lo | (((qh >> (2u * quarter)) & 3u) << 4u));
}

// The contribution of block `ib` (weights at byte wb) for token t: ggml's per-block expression.
fn block_dot(wb: u32, t: u32, ib: u32) -> f32 {
    let cols = P.cols;
    let bs = block_size();
    let nb = cols / bs;
    let xa = t * cols + ib * bs;
    switch WTYPE {
        case 0u: {
            return bitcast<f32>(W[wb >> 2u]) * XF[xa];
        }
        case 1u: {
            return w_f16(wb) * XF[xa];
        }
        case 2u: {
            var sumi = 0i;
            for (var j = 0u; j < 16u; j++) {
                let q = w_u8(wb + 2u + j);
                sumi += (i32(q & 0xFu) - 8) * xq(xa + j) + (i32(q >> 4u) - 8) * xq(xa + j + 16u);
            }
            return f32(sumi) * (w_f16(wb) * XD[t * nb + ib]);
        }
        case 6u: {
            let qh = w_u32(wb + 2u);
            var sumi = 0i;
            for (var j = 0u; j < 32u; j++) {
                var lo: u32;
                if (j < 16u) {
                    lo = w_u8(wb + 6u + j) & 0xFu;
                } else {
                    lo = w_u8(wb + 6u + j - 16u) >> 4u;
                }
                let q = i32(lo | (((qh >> j) & 1u) << 4u)) - 16;
                sumi += q * xq(xa + j);
            }
            return f32(sumi) * (w_f16(wb) * XD[t * nb + ib]);
        }
        case 8u: {
            var sumi = 0i;
            for (var j = 0u; j < 32u; j++) {
                sumi += w_i8(wb + 2u + j) * xq(xa + j);
            }
            return f32(sumi) * (w_f16(wb) * XD[t * nb + ib]);
        }
        case 12u: {
            var sumi = 0i;
            var summ = 0i;
            let bsum = (t * nb + ib) * 16u;
            for (var j = 0u; j < 8u; j++) {
                let scm = scale_min_k4(wb + 4u, j);
                let qs = wb + 16u + 32u * (j / 2u);
                var s = 0i;
                for (var l = 0u; l < 32u; l++) {
                    var q = w_u8(qs + l);
                    if ((j & 1u) == 0u) {
                        q = q & 0xFu;
                    } else {
                        q = q >> 4u;
                    }
                    s += i32(q) * xq(xa + 32u * j + l);
                }
                sumi += i32(scm.x) * s;
                summ += i32(scm.y) * (XB[bsum + 2u * j] + XB[bsum + 2u * j + 1u]);
            }
            let d8 = XD[t * nb + ib];
            return w_f16(wb) * d8 * f32(sumi) - w_f16(wb + 2u) * d8 * f32(summ);
        }
        default: {
            var sumi = 0i;
            for (var j = 0u; j < 16u; j++) {
                var s = 0i;
                for (var p = 16u * j; p < 16u * j + 16u; p++) {
                    s += (q6(wb, p) - 32) * xq(xa + p);
                }
                sumi += w_i8(wb + 192u + j) * s;
            }
            return w_f16(wb + 208u) * XD[t * nb + ib] * f32(sumi);
        }
    }
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let k = wid.x + wid.y * nwg.x;
    let t = wid.z;
    if (k >= P.count) {
        return;
    }
    var row: u32;
    if (GATHER) {
        row = IDX[P.first + k] - P.row_base;
    } else {
        row = k;
    }
    // The mask is read per workgroup, so the barriers below stay in uniform control flow.
    let skip = MASK && IDX[P.row_base + row] == 0u;
    let nb = P.cols / block_size();
    let bb = block_bytes();
    let row0 = row * P.row_bytes;
    var acc = 0.0;
    if (!skip) {
        for (var ib = lid; ib < nb; ib += WG) {
            acc += block_dot(row0 + ib * bb, t, ib);
        }
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        var v = partial[0];
        if (RELU) {
            v = max(v, 0.0);
        }
        if (ROUND_F16) {
            v = round_f16(v);
        }
        if (skip) {
            v = 0.0;
        }
        Y[P.y_base + t * P.y_stride + P.y_off + k] = v;
    }
}
