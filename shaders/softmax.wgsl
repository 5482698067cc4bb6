// In-place softmax of each row (max-subtracted), one workgroup per row.

// Invocations per workgroup (a power of two, at most 256).
override WG: u32 = 64u;

struct Params {
    // Values per row.
    n: u32,
}

@group(0) @binding(0) var<storage, read_write> X: array<f32>;
@group(1) @binding(0) var<uniform> P: Params;

var<workgroup> partial: array<f32, 256>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = wid.x * P.n;
    var m = -3.4028234e38; // -f32 max (Tint rejects literals above it, even ones that round to it)
    for (var i = lid; i < P.n; i += WG) {
        m = max(m, X[base + i]);
    }
    partial[lid] = m;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            partial[lid] = max(partial[lid], partial[lid + s]);
        }
        workgroupBarrier();
    }
    let mx = partial[0];
    workgroupBarrier();
    var acc = 0.0;
    for (var i = lid; i < P.n; i += WG) {
        let e = exp(X[base + i] - mx);
        X[base + i] = e;
        acc += e;
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / partial[0];
    for (var i = lid; i < P.n; i += WG) {
        X[base + i] = X[base + i] * inv;
    }
}
