// Activation quantisation on the GPU, exactly as the CPU's `matmul` quantises its input (so a
// product whose input never leaves the GPU sees the CPU's quants, up to the float rounding of the
// values being quantised): one invocation per block of a row of X.
// - `q8_0`: ggml's x86 `quantize_row_q8_0`: `d = f16(amax / 127)`, quants
//   `round_half_even(x * (127 / amax))`; with ROUND_OUT the dequantised values `d · q` go to XF
//   (the rounding the sparse axpy's coefficients get).
// - `q8_k`: ggml's `quantize_row_q8_K_ref`: the value of largest magnitude `max` (first one),
//   `iscale = -127 / max`, quants `min(nearest_int(iscale · x), 127)`, `d = 1 / iscale`, the sums of
//   each 16 quants.
// - `to_f16`: each value rounded to f16 (the input of an F16 product), into XF.
// Needs f16.wgsl.

// Writes the dequantised values of `q8_0` to XF.
override ROUND_OUT: bool = false;
// Invocations per workgroup (at most 256).
override WG: u32 = 64u;

struct Params {
    // Values (a whole number of blocks for q8_0 and q8_k).
    n: u32,
}

@group(0) @binding(0) var<storage, read> X: array<f32>;
// Rounded floats (to_f16; q8_0 with ROUND_OUT).
@group(0) @binding(1) var<storage, read_write> XF: array<f32>;
// Quants, four i8 per u32, little-endian.
@group(0) @binding(2) var<storage, read_write> XQ: array<u32>;
// One scale per block.
@group(0) @binding(3) var<storage, read_write> XD: array<f32>;
// Q8_K: the sum of each 16 quants.
@group(0) @binding(4) var<storage, read_write> XB: array<i32>;
@group(1) @binding(0) var<uniform> P: Params;

fn index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

// Packs the 4 quants starting at value i (a multiple of 4) into XQ.
fn store4(i: u32, q0: i32, q1: i32, q2: i32, q3: i32) {
    XQ[i >> 2u] = (u32(q0) & 0xFFu) | ((u32(q1) & 0xFFu) << 8u) | ((u32(q2) & 0xFFu) << 16u)
        | ((u32(q3) & 0xFFu) << 24u);
}

fn q8_0_quant(v: f32, id: f32) -> i32 {
    return clamp(i32(round(v * id)), -128, 127);
}

@compute @workgroup_size(WG)
fn q8_0(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let b = index(gid, nwg);
    if (b >= P.n / 32u) {
        return;
    }
    let base = b * 32u;
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        amax = max(amax, abs(X[base + j]));
    }
    let d = round_f16(amax / 127.0);
    var id = 0.0;
    if (amax != 0.0) {
        id = 127.0 / amax;
    }
    XD[b] = d;
    for (var j = 0u; j < 32u; j += 4u) {
        let i = base + j;
        let q0 = q8_0_quant(X[i], id);
        let q1 = q8_0_quant(X[i + 1u], id);
        let q2 = q8_0_quant(X[i + 2u], id);
        let q3 = q8_0_quant(X[i + 3u], id);
        store4(i, q0, q1, q2, q3);
        if (ROUND_OUT) {
            XF[i] = d * f32(q0);
            XF[i + 1u] = d * f32(q1);
            XF[i + 2u] = d * f32(q2);
            XF[i + 3u] = d * f32(q3);
        }
    }
}

fn q8_k_quant(v: f32, iscale: f32) -> i32 {
    return min(i32(round(iscale * v)), 127);
}

@compute @workgroup_size(WG)
fn q8_k(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let b = index(gid, nwg);
    if (b >= P.n / 256u) {
        return;
    }
    let base = b * 256u;
    var amax = 0.0;
    var mx = 0.0;
    for (var j = 0u; j < 256u; j++) {
        let v = X[base + j];
        if (abs(v) > amax) {
            amax = abs(v);
            mx = v;
        }
    }
    if (amax == 0.0) {
        XD[b] = 0.0;
        for (var j = 0u; j < 64u; j++) {
            XQ[base / 4u + j] = 0u;
        }
        for (var j = 0u; j < 16u; j++) {
            XB[b * 16u + j] = 0;
        }
        return;
    }
    let iscale = -127.0 / mx;
    for (var g = 0u; g < 16u; g++) {
        var sum = 0i;
        for (var j = 0u; j < 16u; j += 4u) {
            let i = base + 16u * g + j;
            let q0 = q8_k_quant(X[i], iscale);
            let q1 = q8_k_quant(X[i + 1u], iscale);
            let q2 = q8_k_quant(X[i + 2u], iscale);
            let q3 = q8_k_quant(X[i + 3u], iscale);
            store4(i, q0, q1, q2, q3);
            sum += q0 + q1 + q2 + q3;
        }
        XB[b * 16u + g] = sum;
    }
    XD[b] = 1.0 / iscale;
}

@compute @workgroup_size(WG)
fn to_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i < P.n) {
        XF[i] = round_f16(X[i]);
    }
}
