// RMSNorm, `y = x / sqrt(mean(x²) + eps) · w`, one workgroup per row (as the CPU's `rms_norm`,
// which sums the squares in f64; here the sum is an f32 tree, so results agree to float rounding).

// Invocations per workgroup (a power of two, at most 256).
override WG: u32 = 64u;

struct Params {
    // Values per row.
    n: u32,
    // Added to the mean square.
    eps: f32,
}

@group(0) @binding(0) var<storage, read_write> X: array<f32>;
@group(0) @binding(1) var<storage, read> NW: array<f32>;
@group(1) @binding(0) var<uniform> P: Params;

var<workgroup> partial: array<f32, 256>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = wid.x * P.n;
    var acc = 0.0;
    for (var i = lid; i < P.n; i += WG) {
        let v = X[base + i];
        acc += v * v;
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(partial[0] / f32(P.n) + P.eps);
    for (var i = lid; i < P.n; i += WG) {
        X[base + i] = X[base + i] * scale * NW[i];
    }
}
