// Attention of new query rows over the f16 KV cache, one workgroup per (query head, token), as the
// CPU's `attend`: the query rounded to f16, scores `q·k · scale` over the causal (and optionally
// sliding) window, softmax, probabilities rounded to f16, then `Σ p_j v_j`. Scores go through the
// scratch buffer S (a window may be longer than workgroup memory). Needs f16.wgsl.

// Invocations per workgroup (a power of two, at most 256).
override WG: u32 = 64u;

struct Params {
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    head_dim_v: u32,
    // Position of the first query row.
    pos0: u32,
    // Sliding window in positions (0: none).
    window: u32,
    // Scratch scores per (token, head): the context size.
    s_stride: u32,
    // Multiplies the scores.
    scale: f32,
}

// Queries, n_tokens × n_head × head_dim.
@group(0) @binding(0) var<storage, read> Q: array<f32>;
// Keys and values as f16 pairs per u32: position-major, n_head_kv × head_dim(_v) per position.
@group(0) @binding(1) var<storage, read> K: array<u32>;
@group(0) @binding(2) var<storage, read> V: array<u32>;
@group(0) @binding(3) var<storage, read_write> S: array<f32>;
// Outputs, n_tokens × n_head × head_dim_v.
@group(0) @binding(4) var<storage, read_write> O: array<f32>;
@group(1) @binding(0) var<uniform> P: Params;

var<workgroup> partial: array<f32, 256>;

fn half_at(buf_is_k: bool, i: u32) -> f32 {
    var word: u32;
    if (buf_is_k) {
        word = K[i >> 1u];
    } else {
        word = V[i >> 1u];
    }
    return f16_bits_to_f32((word >> (16u * (i & 1u))) & 0xFFFFu);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let t = wid.y;
    let group = P.n_head / P.n_head_kv;
    let kvh = h / group;
    let p = P.pos0 + t;
    var first = 0u;
    if (P.window > 0u && p + 1u > P.window) {
        first = p + 1u - P.window;
    }
    let n_keys = p + 1u - first;
    let q0 = (t * P.n_head + h) * P.head_dim;
    let s0 = (t * P.n_head + h) * P.s_stride;
    let k_width = P.n_head_kv * P.head_dim;
    let v_width = P.n_head_kv * P.head_dim_v;

    var m = -3.4028234e38; // -f32 max (Tint rejects literals above it, even ones that round to it)
    for (var jj = lid; jj < n_keys; jj += WG) {
        let kb = (first + jj) * k_width + kvh * P.head_dim;
        var dot = 0.0;
        for (var d = 0u; d < P.head_dim; d++) {
            dot += round_f16(Q[q0 + d]) * half_at(true, kb + d);
        }
        let sc = dot * P.scale;
        S[s0 + jj] = sc;
        m = max(m, sc);
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
    for (var jj = lid; jj < n_keys; jj += WG) {
        let e = exp(S[s0 + jj] - mx);
        S[s0 + jj] = e;
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
    for (var jj = lid; jj < n_keys; jj += WG) {
        S[s0 + jj] = round_f16(S[s0 + jj] * inv);
    }
    storageBarrier();
    workgroupBarrier();
    let o0 = (t * P.n_head + h) * P.head_dim_v;
    for (var d = lid; d < P.head_dim_v; d += WG) {
        var o = 0.0;
        for (var jj = 0u; jj < n_keys; jj++) {
            let vb = (first + jj) * v_width + kvh * P.head_dim_v;
            o += S[s0 + jj] * half_at(false, vb + d);
        }
        O[o0 + d] = o;
    }
}
