//! Unit tests of the GGUF reader and writer: round trips and hand-made hostile files.

use super::*;
use crate::quant::GgmlType;
use crate::Error;

fn sample_writer() -> GgufWriter<'static> {
    let mut w = GgufWriter::new(Magic::Gguf);
    w.set("general.architecture", MetaValue::String("llama".into()));
    w.set("llama.block_count", MetaValue::U32(2));
    w.set("test.i8", MetaValue::I8(-5));
    w.set("test.u16", MetaValue::U16(65535));
    w.set("test.i16", MetaValue::I16(-300));
    w.set("test.i32", MetaValue::I32(-70000));
    w.set("test.f32", MetaValue::F32(1.5e-6));
    w.set("test.bool", MetaValue::Bool(true));
    w.set("test.u64", MetaValue::U64(1 << 40));
    w.set("test.i64", MetaValue::I64(-(1 << 40)));
    w.set("test.f64", MetaValue::F64(std::f64::consts::PI));
    w.set("test.u8", MetaValue::U8(200));
    w.set(
        "test.strings",
        MetaValue::Array(MetaArray::String(vec!["a".into(), "".into(), "ünï".into()])),
    );
    w.set(
        "test.nested",
        MetaValue::Array(MetaArray::Array(vec![
            MetaArray::I32(vec![1, 2, 3]),
            MetaArray::F32(vec![0.5]),
            MetaArray::Array(vec![MetaArray::Bool(vec![true, false])]),
        ])),
    );
    w.add_tensor("a", GgmlType::F32, &[3, 2], (0..24u8).collect::<Vec<_>>())
        .unwrap();
    w.add_tensor("b", GgmlType::Q8_0, &[32], vec![7u8; 34])
        .unwrap();
    w.add_tensor("c", GgmlType::F16, &[5], vec![1u8; 10])
        .unwrap();
    w
}

fn sample_bytes() -> Vec<u8> {
    sample_writer().to_bytes().unwrap()
}

#[test]
fn round_trip_keeps_metadata_tensors_and_bytes() {
    let bytes = sample_bytes();
    let file = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(file.magic(), Magic::Gguf);
    assert_eq!(file.version(), 3);
    assert_eq!(file.metadata().len(), 14);
    assert_eq!(
        file.get("test.f64"),
        Some(&MetaValue::F64(std::f64::consts::PI))
    );
    assert_eq!(file.get_u64("llama.block_count").unwrap(), Some(2));
    assert_eq!(file.architecture().unwrap(), "llama");
    let a = file.tensor("a").unwrap();
    assert_eq!(a.shape, vec![3, 2]);
    assert_eq!(
        file.tensor_data(a),
        (0..24u8).collect::<Vec<_>>().as_slice()
    );
    assert_eq!(file.tensor_data(file.tensor("b").unwrap()), &[7u8; 34][..]);
    for t in file.tensors() {
        assert_eq!(t.offset % 32, 0);
    }
    let again = GgufWriter::from_file(&file).to_bytes().unwrap();
    assert_eq!(
        again, bytes,
        "read → write must reproduce the file byte for byte"
    );
}

#[test]
fn power_infer_magic_is_kept() {
    let mut w = sample_writer();
    w.set_magic(Magic::PowerInfer);
    let bytes = w.to_bytes().unwrap();
    assert_eq!(&bytes[..4], b"PWRI");
    let file = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(file.magic(), Magic::PowerInfer);
    assert_eq!(GgufWriter::from_file(&file).to_bytes().unwrap(), bytes);
}

#[test]
fn custom_alignment_is_honoured() {
    let mut w = sample_writer();
    w.set("general.alignment", MetaValue::U32(64));
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(file.alignment(), 64);
    assert_eq!(file.data_offset() % 64, 0);
    assert!(file.tensors().iter().all(|t| t.offset % 64 == 0));
    w.set("general.alignment", MetaValue::U32(48));
    assert!(w.to_bytes().is_err());
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample_bytes();
    let file = GgufFile::from_bytes(bytes.clone()).unwrap();
    let c = file.tensor("c").unwrap();
    let data_end = (file.data_offset() + c.offset + c.n_bytes) as usize;
    // Cutting only the padding after the last tensor leaves a valid file.
    assert!(GgufFile::from_bytes(bytes[..data_end].to_vec()).is_ok());
    for len in 0..data_end {
        let err = GgufFile::from_bytes(bytes[..len].to_vec()).err();
        assert!(
            err.is_some(),
            "a file cut at {len} of {} bytes parsed",
            bytes.len()
        );
    }
}

/// The header of a file with no tensors and the given metadata entries (raw bytes each).
fn raw_file(version: u32, n_tensors: u64, kvs: &[Vec<u8>]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&n_tensors.to_le_bytes());
    b.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for kv in kvs {
        b.extend_from_slice(kv);
    }
    b
}

fn raw_key(key: &str, type_id: u32, value: &[u8]) -> Vec<u8> {
    let mut b = (key.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(key.as_bytes());
    b.extend_from_slice(&type_id.to_le_bytes());
    b.extend_from_slice(value);
    b
}

fn parse(bytes: Vec<u8>) -> Error {
    match GgufFile::from_bytes(bytes) {
        Ok(_) => panic!("hostile file parsed"),
        Err(e) => e,
    }
}

#[test]
fn wrong_magic_and_versions() {
    let mut b = sample_bytes();
    b[..4].copy_from_slice(b"GGML");
    assert!(matches!(parse(b), Error::BadMagic(m) if &m == b"GGML"));
    assert!(matches!(
        parse(raw_file(1, 0, &[])),
        Error::UnsupportedVersion(1)
    ));
    assert!(matches!(
        parse(raw_file(4, 0, &[])),
        Error::UnsupportedVersion(4)
    ));
    let be = parse(raw_file(3u32.swap_bytes(), 0, &[]));
    assert!(be.to_string().contains("big-endian"), "{be}");
    assert!(GgufFile::from_bytes(raw_file(2, 0, &[])).is_ok());
}

#[test]
fn absurd_counts_are_rejected_before_allocation() {
    let e = parse(raw_file(3, 1 << 60, &[]));
    assert!(e.to_string().contains("tensor count"), "{e}");
    let mut b = raw_file(3, 0, &[]);
    b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = parse(b);
    assert!(e.to_string().contains("metadata count"), "{e}");
    // A 2^40-byte string.
    let mut kv = (1u64 << 40).to_le_bytes().to_vec();
    kv.extend_from_slice(&[b'a'; 16]);
    let e = parse(raw_file(3, 0, &[kv]));
    assert!(
        matches!(e, Error::Truncated { needed, .. } if needed == 1 << 40),
        "{e}"
    );
    // An array of 2^62 u64 elements.
    let mut arr = 10u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&(1u64 << 62).to_le_bytes());
    let e = parse(raw_file(3, 0, &[raw_key("big", 9, &arr)]));
    assert!(e.to_string().contains("\"big\""), "{e}");
}

#[test]
fn million_deep_nesting_is_rejected() {
    let mut value = Vec::with_capacity(12 * 1_000_000);
    for _ in 0..1_000_000 {
        value.extend_from_slice(&9u32.to_le_bytes());
        value.extend_from_slice(&1u64.to_le_bytes());
    }
    let e = parse(raw_file(3, 0, &[raw_key("deep", 9, &value)]));
    assert!(e.to_string().contains("nested deeper"), "{e}");
}

#[test]
fn bad_values_are_rejected() {
    let e = parse(raw_file(3, 0, &[raw_key("t", 13, &[])]));
    assert!(e.to_string().contains("unknown value type 13"), "{e}");
    let e = parse(raw_file(3, 0, &[raw_key("b", 7, &[2])]));
    assert!(e.to_string().contains("bool"), "{e}");
    let mut s = 2u64.to_le_bytes().to_vec();
    s.extend_from_slice(&[0xff, 0xfe]);
    let e = parse(raw_file(3, 0, &[raw_key("s", 8, &s)]));
    assert!(e.to_string().contains("UTF-8"), "{e}");
    let kv = raw_key("k", 4, &1u32.to_le_bytes());
    let e = parse(raw_file(3, 0, &[kv.clone(), kv]));
    assert!(e.to_string().contains("duplicate metadata key"), "{e}");
    let e = parse(raw_file(
        3,
        0,
        &[raw_key("general.alignment", 4, &3u32.to_le_bytes())],
    ));
    assert!(
        matches!(e, Error::Metadata { ref key, .. } if key == "general.alignment"),
        "{e}"
    );
}

/// A file with one tensor info written by hand.
fn one_tensor(n_dims: u32, dims: &[u64], type_id: u32, offset: u64, data_len: usize) -> Vec<u8> {
    let mut b = raw_file(3, 1, &[]);
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b'w');
    b.extend_from_slice(&n_dims.to_le_bytes());
    for d in dims {
        b.extend_from_slice(&d.to_le_bytes());
    }
    b.extend_from_slice(&type_id.to_le_bytes());
    b.extend_from_slice(&offset.to_le_bytes());
    b.resize(b.len().next_multiple_of(32) + data_len, 0);
    b
}

#[test]
fn bad_tensor_infos_are_rejected() {
    assert!(GgufFile::from_bytes(one_tensor(2, &[4, 2], 0, 0, 32)).is_ok());
    let e = parse(one_tensor(2, &[4, 2], 0, 0, 31));
    assert!(
        matches!(e, Error::Truncated { ref what, .. } if what.contains("\"w\"")),
        "{e}"
    );
    let e = parse(one_tensor(2, &[4, 2], 0, 16, 64));
    assert!(e.to_string().contains("alignment"), "{e}");
    let e = parse(one_tensor(2, &[4, 2], 77, 0, 32));
    assert!(
        matches!(e, Error::UnknownGgmlType { id: 77, ref tensor } if tensor == "w"),
        "{e}"
    );
    let e = parse(one_tensor(5, &[1, 1, 1, 1, 1], 0, 0, 32));
    assert!(e.to_string().contains("5 dimensions"), "{e}");
    let e = parse(one_tensor(2, &[1 << 32, 1 << 32], 0, 0, 32));
    assert!(e.to_string().contains("overflows"), "{e}");
    let e = parse(one_tensor(1, &[33], 8, 0, 64));
    assert!(e.to_string().contains("block size"), "{e}");
    let e = parse(one_tensor(1, &[8], 0, u64::MAX - 31, 64));
    assert!(matches!(e, Error::Truncated { .. }), "{e}");
}

#[test]
fn overlapping_tensors_are_rejected() {
    let mut w = GgufWriter::new(Magic::Gguf);
    w.add_tensor("a", GgmlType::F32, &[3, 2], vec![1u8; 24])
        .unwrap();
    w.add_tensor("z", GgmlType::F32, &[3, 2], vec![2u8; 24])
        .unwrap();
    let mut bytes = w.to_bytes().unwrap();
    // Point z's offset (the last 8 bytes of the tensor table) at a's data.
    let mut name_z = 1u64.to_le_bytes().to_vec();
    name_z.push(b'z');
    let z_offset_pos = bytes.windows(9).position(|w| w == name_z).unwrap() + 9 + 4 + 16 + 4;
    bytes[z_offset_pos..z_offset_pos + 8].copy_from_slice(&0u64.to_le_bytes());
    let e = parse(bytes);
    assert!(e.to_string().contains("overlap"), "{e}");
}

#[test]
fn writer_rejects_inconsistent_tensors() {
    let mut w = GgufWriter::new(Magic::Gguf);
    assert!(w
        .add_tensor("x", GgmlType::F32, &[4], vec![0u8; 15])
        .is_err());
    assert!(w
        .add_tensor("x", GgmlType::Q4_0, &[31], vec![0u8; 18])
        .is_err());
    assert!(w.add_tensor("x", GgmlType::F32, &[], vec![]).is_err());
    w.add_tensor("x", GgmlType::F32, &[4], vec![0u8; 16])
        .unwrap();
    assert!(w
        .add_tensor("x", GgmlType::F32, &[4], vec![0u8; 16])
        .is_err());
}

/// Inputs that once made the reader panic, found by `cargo fuzz` (kept as regression tests).
#[test]
fn fuzz_regressions() {
    // A zero-byte tensor in a file that ends before the data section starts.
    let crash = include_bytes!("testdata/fuzz-crash-empty-tensor-past-eof.gguf");
    let e = parse(crash.to_vec());
    assert!(matches!(e, Error::Truncated { .. }), "{e}");
    let mut b = one_tensor(1, &[0], 0, 0, 0);
    let header_end = b.len();
    b.truncate(header_end - 8);
    assert!(matches!(parse(b), Error::Truncated { .. }));
}

#[test]
fn stream_checks_order_sizes_and_completeness() {
    use super::{GgufWriter, Magic, TensorDecl};
    let decl = |name: &str| TensorDecl {
        name: name.into(),
        ty: GgmlType::F32,
        shape: vec![2],
    };
    let mut meta = GgufWriter::new(Magic::Gguf);
    meta.set("general.architecture", MetaValue::String("llama".into()));
    let mut whole = GgufWriter::new(Magic::Gguf);
    whole.set("general.architecture", MetaValue::String("llama".into()));
    whole
        .add_tensor("a", GgmlType::F32, &[2], vec![1u8; 8])
        .unwrap();
    whole
        .add_tensor("b", GgmlType::F32, &[2], vec![2u8; 8])
        .unwrap();

    let mut s = meta.stream(vec![decl("a"), decl("b")], Vec::new()).unwrap();
    assert!(s.write_tensor("b", &[2u8; 8]).is_err(), "out of order");
    assert!(s.write_tensor("a", &[1u8; 4]).is_err(), "wrong size");
    s.write_tensor("a", &[1u8; 8]).unwrap();
    assert_eq!(s.next_tensor().unwrap().name, "b");
    s.write_tensor("b", &[2u8; 8]).unwrap();
    assert!(s.write_tensor("c", &[0u8; 8]).is_err(), "undeclared");
    assert_eq!(s.finish().unwrap(), whole.to_bytes().unwrap());

    let s = meta.stream(vec![decl("a"), decl("b")], Vec::new()).unwrap();
    assert!(s.finish().is_err(), "tensors missing");
    assert!(meta.stream(vec![decl("a"), decl("a")], Vec::new()).is_err());
    assert!(whole.stream(vec![decl("c")], Vec::new()).is_err());
}
