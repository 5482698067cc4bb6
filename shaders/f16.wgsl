// f16 <-> f32 with integer arithmetic (prepended to the kernels that need it), so results do not
// depend on the device's conversion rounding and no `shader-f16` feature is needed.

// The f32 value of the f16 with bits `h` (exact, subnormals included).
fn f16_bits_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1Fu;
    let m = h & 0x3FFu;
    if (e == 0u) {
        let v = f32(m) * 5.9604644775390625e-8; // 2^-24, exact
        return select(v, -v, sign != 0u);
    }
    if (e == 31u) {
        return bitcast<f32>(sign | 0x7F800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

// The bits of the f16 nearest to `x` (ties to even), as `half::f16::from_f32` rounds.
fn f32_to_f16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let e = i32((b >> 23u) & 0xFFu);
    let m = b & 0x7FFFFFu;
    if (e == 255) {
        return sign | 0x7C00u | select(0u, 0x200u, m != 0u);
    }
    let he = e - 112;
    if (he >= 31) {
        return sign | 0x7C00u;
    }
    if (he <= 0) {
        if (he < -10) {
            return sign;
        }
        let mm = m | 0x800000u;
        let shift = u32(14 - he);
        var hm = mm >> shift;
        let rem = mm & ((1u << shift) - 1u);
        let half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (hm & 1u) == 1u)) {
            hm += 1u;
        }
        return sign | hm;
    }
    var r = sign | (u32(he) << 10u) | (m >> 13u);
    let rem = m & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u) == 1u)) {
        r += 1u;
    }
    return r;
}

// `x` rounded to the nearest f16 (ties to even), as f32.
fn round_f16(x: f32) -> f32 {
    return f16_bits_to_f32(f32_to_f16_bits(x));
}
