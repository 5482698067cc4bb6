//! Unit tests of the row API: round-trip error bounds, unaligned buffers, length and type errors.
//! (Bit-exactness with ggml and gguf-py is tested in `core/tests/quant_vectors.rs`.)

use super::*;

/// Deterministic, roughly Gaussian values (sum of uniforms from an LCG).
fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut uniform = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..n)
        .map(|_| (0..4).map(|_| uniform()).sum::<f32>() - 2.0)
        .collect()
}

/// Every type with a quantiser, and the largest relative RMS error of a quantise → dequantise round
/// trip on Gaussian data it may show.
const ROUND_TRIP: &[(GgmlType, f32)] = &[
    (GgmlType::F32, 0.0),
    (GgmlType::F16, 1e-3),
    (GgmlType::BF16, 5e-3),
    (GgmlType::Q8_0, 0.01),
    (GgmlType::Q8_1, 0.01),
    (GgmlType::Q8_K, 0.01),
    (GgmlType::Q6_K, 0.02),
    (GgmlType::Q5_0, 0.05),
    (GgmlType::Q5_1, 0.05),
    (GgmlType::Q5_K, 0.05),
    (GgmlType::Q4_0, 0.1),
    (GgmlType::Q4_1, 0.1),
    (GgmlType::Q4_K, 0.1),
    (GgmlType::Q3_K, 0.2),
    (GgmlType::Q2_K, 0.4),
];

fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let mut q = vec![0u8; ty.row_bytes(x.len() as u64).unwrap() as usize];
    quantize(ty, x, &mut q).unwrap();
    let mut y = vec![0.0f32; x.len()];
    dequantize(ty, &q, &mut y).unwrap();
    y
}

#[test]
fn round_trip_error_is_bounded() {
    for &(ty, bound) in ROUND_TRIP {
        let x: Vec<f32> = gaussian(1024, ty as u64).iter().map(|v| v * 3.0).collect();
        let y = round_trip(ty, &x);
        let err2: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
        let sig2: f32 = x.iter().map(|a| a * a).sum();
        let rel = (err2 / sig2).sqrt();
        assert!(rel <= bound, "{ty}: relative RMS error {rel} > {bound}");
        assert!(y.iter().all(|v| v.is_finite()), "{ty}");
    }
}

#[test]
fn zeros_round_trip_to_zeros() {
    for &(ty, _) in ROUND_TRIP {
        let y = round_trip(ty, &[0.0; 512]);
        assert!(y.iter().all(|&v| v == 0.0), "{ty}");
    }
}

#[test]
fn q8_k_bsums_and_q8_1_sum() {
    let x = gaussian(512, 7);
    let mut q = vec![0u8; GgmlType::Q8_K.row_bytes(512).unwrap() as usize];
    quantize(GgmlType::Q8_K, &x, &mut q).unwrap();
    for chunk in q.chunks_exact(std::mem::size_of::<BlockQ8K>()) {
        let b: BlockQ8K = bytemuck::pod_read_unaligned(chunk);
        for (s, qs) in b.bsums.iter().zip(b.qs.chunks_exact(16)) {
            assert_eq!(*s as i32, qs.iter().map(|&v| v as i32).sum::<i32>());
        }
        // the sign trick: the largest magnitude maps to -127
        assert!(b.qs.contains(&-127));
    }
    let mut q = vec![0u8; GgmlType::Q8_1.row_bytes(512).unwrap() as usize];
    quantize(GgmlType::Q8_1, &x, &mut q).unwrap();
    for chunk in q.chunks_exact(std::mem::size_of::<BlockQ8_1>()) {
        let b: BlockQ8_1 = bytemuck::pod_read_unaligned(chunk);
        let sum: i32 = b.qs.iter().map(|&v| v as i32).sum();
        // s is d * sum with the unrounded f32 d, so only close to the f16 d's product
        let want = sum as f32 * b.d.to_f32();
        assert!(
            (b.s.to_f32() - want).abs() <= 2e-3 * want.abs() + 1e-3,
            "{} vs {want}",
            b.s
        );
    }
}

#[test]
fn unaligned_buffers_give_the_same_result() {
    for &(ty, _) in ROUND_TRIP {
        let x = gaussian(512, 11);
        let n = ty.row_bytes(512).unwrap() as usize;
        let mut aligned = vec![0u64; n / 8 + 1];
        let aligned = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut aligned)[..n];
        quantize(ty, &x, aligned).unwrap();
        for off in 1..4 {
            let mut buf = vec![0u64; n / 8 + 2];
            let bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut buf)[off..off + n];
            quantize(ty, &x, bytes).unwrap();
            assert_eq!(bytes, &*aligned, "{ty} quantise at offset {off}");
            let mut a = vec![0.0f32; 512];
            let mut b = vec![0.0f32; 512];
            dequantize(ty, aligned, &mut a).unwrap();
            dequantize(ty, bytes, &mut b).unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "{ty} dequantise at offset {off}");
        }
    }
}

#[test]
fn wrong_lengths_are_errors() {
    for &(ty, _) in ROUND_TRIP {
        let bs = ty.block_size();
        let n = 2 * bs;
        let bytes = ty.row_bytes(n as u64).unwrap() as usize;
        let mut y = vec![0.0f32; n];
        let x = vec![0.0f32; n];
        for bad in [bytes - 1, bytes + 1, 0] {
            let src = vec![0u8; bad];
            assert!(
                matches!(dequantize(ty, &src, &mut y), Err(Error::InvalidArgument(_))),
                "{ty}"
            );
            let mut dst = vec![0u8; bad];
            assert!(
                matches!(quantize(ty, &x, &mut dst), Err(Error::InvalidArgument(_))),
                "{ty}"
            );
        }
        if bs > 1 {
            let mut y = vec![0.0f32; n - 1];
            let src = vec![0u8; bytes];
            assert!(
                matches!(dequantize(ty, &src, &mut y), Err(Error::InvalidArgument(_))),
                "{ty}"
            );
            let mut dst = vec![0u8; bytes];
            assert!(
                matches!(
                    quantize(ty, &x[1..], &mut dst),
                    Err(Error::InvalidArgument(_))
                ),
                "{ty}"
            );
        }
    }
    // empty rows are fine
    dequantize(GgmlType::Q4_K, &[], &mut []).unwrap();
    quantize(GgmlType::Q4_K, &[], &mut []).unwrap();
}

#[test]
fn unsupported_types_are_errors() {
    for &ty in GgmlType::ALL {
        let n = ty.block_size();
        let mut y = vec![0.0f32; n];
        let mut q = vec![0u8; ty.block_bytes()];
        let d = dequantize(ty, &q, &mut y);
        let s = quantize(ty, &y, &mut q);
        if can_dequantize(ty) {
            d.unwrap();
        } else {
            assert!(
                matches!(
                    d,
                    Err(Error::UnsupportedType {
                        op: "dequantize",
                        ..
                    })
                ),
                "{ty}"
            );
        }
        if can_quantize(ty) {
            s.unwrap();
        } else {
            assert!(
                matches!(s, Err(Error::UnsupportedType { op: "quantize", .. })),
                "{ty}"
            );
        }
    }
}
