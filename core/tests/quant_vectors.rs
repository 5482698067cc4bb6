//! Bit-exact agreement of `hotcold_core::quant` with ggml (C, `scripts/gen_quant_vectors_ggml.c`)
//! and gguf-py (`scripts/gen_quant_vectors.py`) on the committed vectors in `tests/data/quant/`
//! (format in its README.md): quantised bytes compared exactly, f32 values by their bits.

use hotcold_core::quant::{dequantize, quantize, GgmlType};

const HAS_INPUT: u32 = 1;
const HAS_QUANT: u32 = 2;
const HAS_DEQUANT: u32 = 4;

/// One parsed vector file.
struct Vector {
    ty: GgmlType,
    input: Option<Vec<f32>>,
    quant: Option<Vec<u8>>,
    dequant: Option<Vec<f32>>,
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn parse(name: &str, b: &[u8]) -> Vector {
    assert_eq!(&b[..4], b"HCQV", "{name}: magic");
    assert_eq!(u32_at(b, 4), 1, "{name}: version");
    let ty = GgmlType::from_id(u32_at(b, 8)).unwrap_or_else(|| panic!("{name}: type id"));
    let n = u32_at(b, 12) as usize;
    let flags = u32_at(b, 16);
    let nbytes = ty.row_bytes(n as u64).unwrap() as usize;
    let mut off = 20;
    let mut take = |len: usize| {
        let s = &b[off..off + len];
        off += len;
        s
    };
    let input = (flags & HAS_INPUT != 0).then(|| f32s(take(4 * n)));
    let quant = (flags & HAS_QUANT != 0).then(|| take(nbytes).to_vec());
    let dequant = (flags & HAS_DEQUANT != 0).then(|| f32s(take(4 * n)));
    assert_eq!(off, b.len(), "{name}: trailing bytes");
    Vector {
        ty,
        input,
        quant,
        dequant,
    }
}

fn assert_bits_eq(name: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    let bad: Vec<usize> = (0..got.len())
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .collect();
    assert!(
        bad.is_empty(),
        "{name}: {} of {} values differ; first at {}: got {:e} ({:#010x}), want {:e} ({:#010x})",
        bad.len(),
        got.len(),
        bad[0],
        got[bad[0]],
        got[bad[0]].to_bits(),
        want[bad[0]],
        want[bad[0]].to_bits()
    );
}

fn assert_bytes_eq(name: &str, ty: GgmlType, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        let bb = ty.block_bytes();
        panic!(
            "{name}: first differing byte {i} (block {}, byte {} of {bb}): got {:#04x}, want {:#04x}",
            i / bb,
            i % bb,
            got[i],
            want[i]
        );
    }
}

/// Checks every direction the vector has a reference for; returns the checks made.
fn check(name: &str, bytes: &[u8]) -> Vec<&'static str> {
    let v = parse(name, bytes);
    let mut done = Vec::new();
    if let (Some(x), Some(q)) = (&v.input, &v.quant) {
        let mut got = vec![0u8; q.len()];
        quantize(v.ty, x, &mut got).unwrap();
        assert_bytes_eq(name, v.ty, &got, q);
        done.push("quantize");
    }
    if let (Some(q), Some(y)) = (&v.quant, &v.dequant) {
        let mut got = vec![0.0f32; y.len()];
        dequantize(v.ty, q, &mut got).unwrap();
        assert_bits_eq(name, &got, y);
        // and from a misaligned copy of the bytes
        let mut buf = vec![0u8; q.len() + 1];
        buf[1..].copy_from_slice(q);
        dequantize(v.ty, &buf[1..], &mut got).unwrap();
        assert_bits_eq(&format!("{name} (unaligned)"), &got, y);
        done.push("dequantize");
    }
    assert!(!done.is_empty(), "{name}: nothing to check");
    done
}

macro_rules! vector_tests {
    ($($test:ident => $file:literal, [$($dir:literal),*];)*) => {
        $(
            #[test]
            fn $test() {
                let done = check($file, include_bytes!(concat!("data/quant/", $file, ".bin")));
                let want: Vec<&str> = vec![$($dir),*];
                assert_eq!(done, want, $file);
            }
        )*
    };
}

vector_tests! {
    // gguf-py: its quantisers and dequantisers
    gguf_quant_f32 => "gguf_quant_f32", ["quantize", "dequantize"];
    gguf_quant_f16 => "gguf_quant_f16", ["quantize", "dequantize"];
    gguf_quant_bf16 => "gguf_quant_bf16", ["quantize", "dequantize"];
    gguf_quant_q4_0 => "gguf_quant_q4_0", ["quantize", "dequantize"];
    gguf_quant_q4_1 => "gguf_quant_q4_1", ["quantize", "dequantize"];
    gguf_quant_q5_0 => "gguf_quant_q5_0", ["quantize", "dequantize"];
    gguf_quant_q5_1 => "gguf_quant_q5_1", ["quantize", "dequantize"];
    gguf_quant_q8_0 => "gguf_quant_q8_0", ["quantize", "dequantize"];
    // gguf-py: dequantisation of random valid blocks
    gguf_random_f16 => "gguf_random_f16", ["dequantize"];
    gguf_random_bf16 => "gguf_random_bf16", ["dequantize"];
    gguf_random_q4_0 => "gguf_random_q4_0", ["dequantize"];
    gguf_random_q4_1 => "gguf_random_q4_1", ["dequantize"];
    gguf_random_q5_0 => "gguf_random_q5_0", ["dequantize"];
    gguf_random_q5_1 => "gguf_random_q5_1", ["dequantize"];
    gguf_random_q8_0 => "gguf_random_q8_0", ["dequantize"];
    gguf_random_q2_k => "gguf_random_q2_k", ["dequantize"];
    gguf_random_q3_k => "gguf_random_q3_k", ["dequantize"];
    gguf_random_q4_k => "gguf_random_q4_k", ["dequantize"];
    gguf_random_q5_k => "gguf_random_q5_k", ["dequantize"];
    gguf_random_q6_k => "gguf_random_q6_k", ["dequantize"];
    // ggml C: reference quantisers (`quantize_row_*_ref`) and dequantisers
    ggml_quant_f32 => "ggml_quant_f32", ["quantize", "dequantize"];
    ggml_quant_f16 => "ggml_quant_f16", ["quantize", "dequantize"];
    ggml_quant_bf16 => "ggml_quant_bf16", ["quantize", "dequantize"];
    ggml_quant_q4_0 => "ggml_quant_q4_0", ["quantize", "dequantize"];
    ggml_quant_q4_1 => "ggml_quant_q4_1", ["quantize", "dequantize"];
    ggml_quant_q5_0 => "ggml_quant_q5_0", ["quantize", "dequantize"];
    ggml_quant_q5_1 => "ggml_quant_q5_1", ["quantize", "dequantize"];
    ggml_quant_q8_0 => "ggml_quant_q8_0", ["quantize", "dequantize"];
    ggml_quant_q8_1 => "ggml_quant_q8_1", ["quantize"];
    ggml_quant_q2_k => "ggml_quant_q2_k", ["quantize", "dequantize"];
    ggml_quant_q3_k => "ggml_quant_q3_k", ["quantize", "dequantize"];
    ggml_quant_q4_k => "ggml_quant_q4_k", ["quantize", "dequantize"];
    ggml_quant_q5_k => "ggml_quant_q5_k", ["quantize", "dequantize"];
    ggml_quant_q6_k => "ggml_quant_q6_k", ["quantize", "dequantize"];
    ggml_quant_q8_k => "ggml_quant_q8_k", ["quantize", "dequantize"];
    // ggml C: dequantisation of random valid blocks
    ggml_random_f16 => "ggml_random_f16", ["dequantize"];
    ggml_random_bf16 => "ggml_random_bf16", ["dequantize"];
    ggml_random_q4_0 => "ggml_random_q4_0", ["dequantize"];
    ggml_random_q4_1 => "ggml_random_q4_1", ["dequantize"];
    ggml_random_q5_0 => "ggml_random_q5_0", ["dequantize"];
    ggml_random_q5_1 => "ggml_random_q5_1", ["dequantize"];
    ggml_random_q8_0 => "ggml_random_q8_0", ["dequantize"];
    ggml_random_q2_k => "ggml_random_q2_k", ["dequantize"];
    ggml_random_q3_k => "ggml_random_q3_k", ["dequantize"];
    ggml_random_q4_k => "ggml_random_q4_k", ["dequantize"];
    ggml_random_q5_k => "ggml_random_q5_k", ["dequantize"];
    ggml_random_q6_k => "ggml_random_q6_k", ["dequantize"];
    ggml_random_q8_k => "ggml_random_q8_k", ["dequantize"];
}
