// Element-wise kernels over flat f32 arrays, one invocation per element: the FFN's gate/up combine
// (SwiGLU, GeGLU through ggml's f16 GELU table, ReLU, dReLU), `x += y`, `x *= s`, and the
// predictor's threshold (`x = 1` where `x >= s`, else 0: a mask whose zero words the masked matvec
// skips).
// Needs f16.wgsl.

// The FFN activation of `combine`: 0 SiLU, 1 GELU (ggml's table), 2 ReLU, 3 dReLU.
override ACT: u32 = 0u;
// Invocations per workgroup (at most 256).
override WG: u32 = 64u;

struct Params {
    // Elements.
    n: u32,
    // The factor of `scale`; the threshold of `threshold`.
    s: f32,
}

// gate (combine: overwritten with the result) or x.
@group(0) @binding(0) var<storage, read_write> X: array<f32>;
// up or y.
@group(0) @binding(1) var<storage, read> Y: array<f32>;
// ggml's GELU table: the f16 of gelu_tanh(x) for every f16 x, two per u32.
@group(0) @binding(2) var<storage, read> GELU: array<u32>;
@group(1) @binding(0) var<uniform> P: Params;

fn gelu(x: f32) -> f32 {
    if (x <= -10.0) {
        return 0.0;
    }
    if (x >= 10.0) {
        return x;
    }
    let i = f32_to_f16_bits(x);
    return f16_bits_to_f32((GELU[i >> 1u] >> (16u * (i & 1u))) & 0xFFFFu);
}

fn index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

@compute @workgroup_size(WG)
fn combine(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= P.n) {
        return;
    }
    let g = X[i];
    let u = Y[i];
    switch ACT {
        case 0u: { X[i] = g / (1.0 + exp(-g)) * u; }
        case 1u: { X[i] = gelu(g) * u; }
        case 2u: { X[i] = max(g, 0.0) * u; }
        default: { X[i] = max(g, 0.0) * max(u, 0.0); }
    }
}

@compute @workgroup_size(WG)
fn add(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i < P.n) {
        X[i] = X[i] + Y[i];
    }
}

@compute @workgroup_size(WG)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i < P.n) {
        X[i] = X[i] * P.s;
    }
}

@compute @workgroup_size(WG)
fn threshold(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i < P.n) {
        X[i] = select(0.0, 1.0, X[i] >= P.s);
    }
}
