// Helpers prepended to the kernels that read ggml blocks (textual include: WGSL has no imports).
// Packed blocks live in `W: array<u32>` (WGSL has no u8): a byte is read with shifts, little-endian,
// at any byte offset, so rows and blocks need no alignment. Needs f16.wgsl.

fn w_u8(b: u32) -> u32 {
    return (W[b >> 2u] >> ((b & 3u) * 8u)) & 0xFFu;
}

fn w_i8(b: u32) -> i32 {
    return (i32(w_u8(b)) << 24u) >> 24u;
}

fn w_u16(b: u32) -> u32 {
    return w_u8(b) | (w_u8(b + 1u) << 8u);
}

fn w_u32(b: u32) -> u32 {
    return w_u16(b) | (w_u16(b + 2u) << 16u);
}

fn w_f16(b: u32) -> f32 {
    return f16_bits_to_f32(w_u16(b));
}
