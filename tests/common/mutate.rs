//! A seeded mutator of GGUF files for the property test and the long fuzz loop: bit flips, byte
//! overwrites with boundary values (in the header's counts and lengths above all), insertions,
//! deletions and truncations.

use hotcold::gguf::{GgufFile, GgufWriter, MetaArray, MetaValue};

/// xorshift64*: small, seeded, reproducible.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const INTERESTING_U64: [u64; 10] = [
    0,
    1,
    7,
    31,
    255,
    1 << 31,
    1 << 40,
    1 << 60,
    u64::MAX - 1,
    u64::MAX,
];

/// A small file with the structure of a real model: all of `real`'s metadata keys (its big arrays
/// cut to 64 entries) and its tensor infos, with the tensor data replaced by the first few tensors
/// that fit in `budget` bytes.
pub fn shrink_real_file(real: &GgufFile, budget: usize) -> Vec<u8> {
    let mut w = GgufWriter::new(real.magic());
    for (key, value) in real.metadata() {
        let value = match value {
            MetaValue::Array(MetaArray::String(v)) => {
                MetaValue::Array(MetaArray::String(v[..v.len().min(64)].to_vec()))
            }
            MetaValue::Array(MetaArray::F32(v)) => {
                MetaValue::Array(MetaArray::F32(v[..v.len().min(64)].to_vec()))
            }
            MetaValue::Array(MetaArray::I32(v)) => {
                MetaValue::Array(MetaArray::I32(v[..v.len().min(64)].to_vec()))
            }
            other => other.clone(),
        };
        w.set(key.clone(), value);
    }
    let mut used = 0;
    for t in real.tensors() {
        if used + t.n_bytes as usize > budget {
            continue;
        }
        used += t.n_bytes as usize;
        w.add_tensor(t.name.clone(), t.ty, &t.shape, real.tensor_data(t))
            .unwrap();
    }
    w.to_bytes().unwrap()
}

/// Applies one to four random mutations to `bytes`, most of them in the first `header_len` bytes.
pub fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>, header_len: usize) {
    for _ in 0..1 + rng.below(4) {
        let region = if rng.below(10) < 8 {
            header_len.min(bytes.len())
        } else {
            bytes.len()
        };
        if region == 0 {
            bytes.push(rng.next() as u8);
            continue;
        }
        let pos = rng.below(region);
        match rng.below(6) {
            0 => bytes[pos] ^= 1 << rng.below(8),
            1 => bytes[pos] = rng.next() as u8,
            2 => {
                let v = INTERESTING_U64[rng.below(INTERESTING_U64.len())].to_le_bytes();
                let n = [1, 2, 4, 8][rng.below(4)];
                let end = (pos + n).min(bytes.len());
                bytes[pos..end].copy_from_slice(&v[..end - pos]);
            }
            3 => {
                let n = 1 + rng.below(16);
                let insert: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                bytes.splice(pos..pos, insert);
            }
            4 => {
                let end = (pos + 1 + rng.below(16)).min(bytes.len());
                bytes.drain(pos..end);
            }
            _ => bytes.truncate(pos),
        }
    }
}

/// Parses `bytes`; on success touches every tensor's data so that an unchecked offset would fault.
/// Returns whether the file parsed.
pub fn parse_and_touch(bytes: Vec<u8>) -> bool {
    match GgufFile::from_bytes(bytes) {
        Err(e) => {
            assert!(!e.to_string().is_empty());
            false
        }
        Ok(file) => {
            let mut sum = 0u64;
            for t in file.tensors() {
                let data = file.tensor_data(t);
                assert_eq!(data.len() as u64, t.n_bytes);
                sum = sum.wrapping_add(data.iter().map(|&b| u64::from(b)).sum::<u64>());
            }
            std::hint::black_box(sum);
            true
        }
    }
}

/// Runs `iterations` mutations of each seed file; panics naming the seed and iteration of any
/// input that made the reader panic. Returns (parsed, rejected) counts.
pub fn fuzz(seeds: &[Vec<u8>], iterations: u64, seed: u64) -> (u64, u64) {
    let mut rng = Rng::new(seed);
    let (mut ok, mut rejected) = (0, 0);
    for i in 0..iterations {
        let base = &seeds[i as usize % seeds.len()];
        let header_len = GgufFile::from_bytes(base.clone())
            .map(|f| f.data_offset() as usize)
            .unwrap_or(base.len());
        let mut bytes = base.clone();
        mutate(&mut rng, &mut bytes, header_len);
        let input = bytes.clone();
        match std::panic::catch_unwind(move || parse_and_touch(bytes)) {
            Ok(true) => ok += 1,
            Ok(false) => rejected += 1,
            Err(_) => {
                let path = std::env::temp_dir().join(format!("hotcold-gguf-crash-{seed}-{i}.gguf"));
                std::fs::write(&path, &input).unwrap();
                panic!(
                    "the GGUF reader panicked on mutation {i} of seed {seed}; input saved to {}",
                    path.display()
                );
            }
        }
    }
    (ok, rejected)
}
