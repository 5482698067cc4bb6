// The sparse down projection: `Y[t] += Σ_k A[t][k] · W row IDX[k]` over the rows of the
// neuron-major down matrix. A workgroup takes COLS output columns of one token and splits the
// coefficients into WG / COLS consecutive ranges, one invocation per (column, range): each range is
// summed as the CPU's `sparse_axpy` sums (weights dequantised exactly, zero coefficients skipped,
// `fma(a, w, acc)` in the order of IDX), then the ranges' sums are added to Y in range order. One
// invocation per column would leave a GPU with a few thousand long serial loops; this gives it
// WG / COLS times more, each as many times shorter. Dispatched once per weight chunk, in row order; Y
// accumulates across the dispatches. Needs f16.wgsl and bytes.wgsl.

// The weights' ggml type id: 0 F32, 1 F16, 2 Q4_0, 6 Q5_0, 8 Q8_0.
override WTYPE: u32 = 0u;
// Invocations per workgroup (a multiple of COLS, at most 256; the host sets AXPY_WG).
override WG: u32 = 256u;
// Output columns per workgroup (the host's AXPY_COLUMNS); WG / COLS coefficient ranges each.
const COLS: u32 = 16u;

struct Params {
    // Values per weight row (outputs per token).
    cols: u32,
    // Bytes per weight row.
    row_bytes: u32,
    // Rows (coefficients per token) in this dispatch.
    count: u32,
    // Where this dispatch's entries start in IDX and in a token row of A.
    first: u32,
    // Coefficients per token row of A.
    a_stride: u32,
    // The global index of the chunk's first row (subtracted from IDX entries).
    row_base: u32,
    // Token rows.
    n_tokens: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> IDX: array<u32>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;
@group(1) @binding(0) var<uniform> P: Params;

// Weight `c` of the row starting at byte rb, dequantised as ggml does (exact in f32).
fn weight(rb: u32, c: u32) -> f32 {
    switch WTYPE {
        case 0u: {
            return bitcast<f32>(W[(rb >> 2u) + c]);
        }
        case 1u: {
            return w_f16(rb + 2u * c);
        }
        case 2u: {
            let b = rb + (c / 32u) * 18u;
            let j = c % 32u;
            var q: u32;
            if (j < 16u) {
                q = w_u8(b + 2u + j) & 0xFu;
            } else {
                q = w_u8(b + 2u + j - 16u) >> 4u;
            }
            return w_f16(b) * f32(i32(q) - 8);
        }
        case 6u: {
            let b = rb + (c / 32u) * 22u;
            let j = c % 32u;
            var lo: u32;
            if (j < 16u) {
                lo = w_u8(b + 6u + j) & 0xFu;
            } else {
                lo = w_u8(b + 6u + j - 16u) >> 4u;
            }
            let q = lo | (((w_u32(b + 2u) >> j) & 1u) << 4u);
            return w_f16(b) * f32(i32(q) - 16);
        }
        default: {
            let b = rb + (c / 32u) * 34u;
            return w_f16(b) * f32(w_i8(b + 2u + c % 32u));
        }
    }
}

var<workgroup> partial: array<f32, 256>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let col = lid % COLS;
    let slice = lid / COLS;
    let c = wid.x * COLS + col;
    let t = wid.y;
    let slices = WG / COLS;
    let per = (P.count + slices - 1u) / slices;
    let k0 = min(slice * per, P.count);
    let k1 = min(k0 + per, P.count);
    var acc = 0.0;
    if (c < P.cols) {
        for (var k = k0; k < k1; k++) {
            let a = A[t * P.a_stride + P.first + k];
            if (a != 0.0) {
                let row = IDX[P.first + k] - P.row_base;
                acc = fma(a, weight(row * P.row_bytes, c), acc);
            }
        }
    }
    partial[lid] = acc;
    workgroupBarrier();
    if (slice == 0u && c < P.cols) {
        var y = Y[t * P.cols + c];
        for (var r = 0u; r < slices; r++) {
            y += partial[r * COLS + col];
        }
        Y[t * P.cols + c] = y;
    }
}
