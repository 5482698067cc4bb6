// RoPE over the first n_rot dimensions of every head, one invocation per (pair, head, token), with
// the CPU's angles: `theta = pos · theta_scale^i` as a running product, times the linear scale.

// Invocations per workgroup (at most 256).
override WG: u32 = 64u;

struct Params {
    // Heads per token row.
    n_heads: u32,
    // Values per head.
    head_dim: u32,
    // Rotated dimensions per head.
    n_rot: u32,
    // 0: adjacent pairs (2i, 2i+1); 1: halves (i, i + n_rot/2) (NeoX).
    neox: u32,
    // Position of the first token row.
    pos0: u32,
    // Token rows.
    n_tokens: u32,
    // base^(-2/n_rot).
    theta_scale: f32,
    // Linear position scale.
    freq_scale: f32,
}

@group(0) @binding(0) var<storage, read_write> X: array<f32>;
@group(1) @binding(0) var<uniform> P: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half = P.n_rot / 2u;
    let i = gid.x;
    let head = gid.y;
    let t = gid.z;
    if (i >= half || head >= P.n_heads || t >= P.n_tokens) {
        return;
    }
    var theta = f32(P.pos0 + t);
    for (var k = 0u; k < i; k++) {
        theta *= P.theta_scale;
    }
    let angle = theta * P.freq_scale;
    let c = cos(angle);
    let s = sin(angle);
    let base = (t * P.n_heads + head) * P.head_dim;
    var a: u32;
    var b: u32;
    if (P.neox == 1u) {
        a = base + i;
        b = base + i + half;
    } else {
        a = base + 2u * i;
        b = base + 2u * i + 1u;
    }
    let x0 = X[a];
    let x1 = X[b];
    X[a] = x0 * c - x1 * s;
    X[b] = x0 * s + x1 * c;
}
