// Appends one position's keys or values to a layer's f16 KV cache (as the CPU's `KvCache::store`
// converts them: nearest f16, ties to even), one invocation per pair of values. Needs f16.wgsl.

// Invocations per workgroup (at most 256).
override WG: u32 = 64u;

struct Params {
    // Pairs of values to store (the row's width / 2).
    n_pairs: u32,
    // Where the row starts in C, in u32 words (position × width / 2).
    offset: u32,
}

@group(0) @binding(0) var<storage, read> X: array<f32>;
// The cache: f16 pairs per u32, position-major.
@group(0) @binding(1) var<storage, read_write> C: array<u32>;
@group(1) @binding(0) var<uniform> P: Params;

@compute @workgroup_size(WG)
fn store(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < P.n_pairs) {
        C[P.offset + i] = f32_to_f16_bits(X[2u * i]) | (f32_to_f16_bits(X[2u * i + 1u]) << 16u);
    }
}
