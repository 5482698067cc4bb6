//! PowerInfer's hot-neuron side file, `<model>.generated.gpuidx`.
//!
//! What `powerinfer-py` (`export_split.py` in SJTU-IPADS/PowerInfer) writes, through its
//! `gguf-py` writer, and what its `llama.cpp` (`llama_gpu_split_loader`) reads:
//! - a GGUF v3 file whose magic is then overwritten with `PWRI`;
//! - metadata `general.architecture = "generic.gpu_index"` (string),
//!   `generic.gpu_index.block_count` (u32, the number of layers) and `split.vram_capacity` (u64,
//!   the VRAM budget in bytes; the loader refuses the file when its budget is smaller);
//! - per layer, in order, `blk.N.gpu_idx` (I32, one 0/1 per neuron) and `blk.N.gpu_bucket` (I32,
//!   the ids of the neurons with a 1, ascending). The loader takes tensor `2N` as layer N's index
//!   and `2N + 1` as its bucket, by position, not by name.

use crate::gguf::{GgufFile, GgufWriter, Magic, MetaValue, TensorInfo};
use crate::quant::GgmlType;
use crate::{Error, Result};

/// The value of `general.architecture` in a GPU index file.
pub const ARCHITECTURE: &str = "generic.gpu_index";
/// The key of the VRAM budget the index was made for.
pub const VRAM_CAPACITY_KEY: &str = "split.vram_capacity";
/// What PowerInfer appends to a model's path to find its index.
pub const SIDE_FILE_SUFFIX: &str = ".generated.gpuidx";

/// The hot neurons of every layer, as a GPU index file holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuIndex {
    /// Per layer, the number of FFN neurons.
    pub n_neurons: Vec<usize>,
    /// Per layer, the ids of the neurons on the GPU, strictly ascending.
    pub hot: Vec<Vec<u32>>,
    /// The VRAM budget (bytes) the split was made for.
    pub vram_capacity: u64,
}

impl GpuIndex {
    /// Checks that there is one hot list per layer, ascending, without repeats, in range.
    pub fn validate(&self) -> Result<()> {
        if self.hot.len() != self.n_neurons.len() {
            return Err(Error::InvalidArgument(format!(
                "{} hot lists for {} layers",
                self.hot.len(),
                self.n_neurons.len()
            )));
        }
        for (il, (hot, &n)) in self.hot.iter().zip(&self.n_neurons).enumerate() {
            if n > i32::MAX as usize {
                return Err(Error::InvalidArgument(format!(
                    "layer {il}: {n} neurons do not fit I32 ids"
                )));
            }
            if hot.windows(2).any(|w| w[0] >= w[1]) {
                return Err(Error::InvalidArgument(format!(
                    "layer {il}: hot ids are not strictly ascending"
                )));
            }
            if let Some(&last) = hot.last() {
                if last as usize >= n {
                    return Err(Error::InvalidArgument(format!(
                        "layer {il}: hot id {last} out of range for {n} neurons"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The file, as PowerInfer's `export_split.py` lays it out.
    pub fn to_writer(&self) -> Result<GgufWriter<'static>> {
        self.validate()?;
        let mut w = GgufWriter::new(Magic::PowerInfer);
        w.set(
            "general.architecture",
            MetaValue::String(ARCHITECTURE.into()),
        );
        for (il, (hot, &n)) in self.hot.iter().zip(&self.n_neurons).enumerate() {
            let mut mask = vec![0i32; n];
            for &i in hot {
                mask[i as usize] = 1;
            }
            let bucket: Vec<i32> = hot.iter().map(|&i| i as i32).collect();
            w.add_tensor(
                format!("blk.{il}.gpu_idx"),
                GgmlType::I32,
                &[n as u64],
                i32_bytes(&mask),
            )?;
            w.add_tensor(
                format!("blk.{il}.gpu_bucket"),
                GgmlType::I32,
                &[hot.len() as u64],
                i32_bytes(&bucket),
            )?;
        }
        let n_layer = u32::try_from(self.hot.len())
            .map_err(|_| Error::InvalidArgument("too many layers".into()))?;
        w.set(
            format!("{ARCHITECTURE}.block_count"),
            MetaValue::U32(n_layer),
        );
        w.set(VRAM_CAPACITY_KEY, MetaValue::U64(self.vram_capacity));
        Ok(w)
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.to_writer()?.to_bytes()
    }

    /// Reads an index, as PowerInfer does (layer `N` from tensors `2N` and `2N + 1`), and checks
    /// that each bucket lists exactly the neurons its 0/1 index marks.
    pub fn read(file: &GgufFile) -> Result<GpuIndex> {
        let vram_capacity = file
            .get_u64(VRAM_CAPACITY_KEY)?
            .ok_or_else(|| Error::Metadata {
                key: VRAM_CAPACITY_KEY.into(),
                message: "missing (PowerInfer requires it)".into(),
            })?;
        let tensors = file.tensors();
        if !tensors.len().is_multiple_of(2) {
            return Err(Error::InvalidArgument(format!(
                "a GPU index has two tensors per layer, this file has {}",
                tensors.len()
            )));
        }
        let mut index = GpuIndex {
            n_neurons: Vec::new(),
            hot: Vec::new(),
            vram_capacity,
        };
        for (il, pair) in tensors.chunks_exact(2).enumerate() {
            let mask = read_i32(file, &pair[0])?;
            let bucket = read_i32(file, &pair[1])?;
            let marked: Vec<u32> = (0..mask.len() as u32)
                .filter(|&i| mask[i as usize] != 0)
                .collect();
            if let Some(v) = mask.iter().find(|&&v| v != 0 && v != 1) {
                return Err(Error::Tensor {
                    tensor: pair[0].name.clone(),
                    message: format!("value {v} (expected 0 or 1)"),
                });
            }
            let listed: Vec<u32> = bucket
                .iter()
                .map(|&v| u32::try_from(v).unwrap_or(u32::MAX))
                .collect();
            if listed != marked {
                return Err(Error::Tensor {
                    tensor: pair[1].name.clone(),
                    message: format!(
                        "layer {il}: the bucket does not list the {} neurons the index marks, \
                         ascending",
                        marked.len()
                    ),
                });
            }
            index.n_neurons.push(mask.len());
            index.hot.push(marked);
        }
        Ok(index)
    }

    /// The side-file path PowerInfer looks for next to `model`.
    pub fn side_file_path(model: &std::path::Path) -> std::path::PathBuf {
        let mut s = model.as_os_str().to_owned();
        s.push(SIDE_FILE_SUFFIX);
        s.into()
    }
}

fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn read_i32(file: &GgufFile, t: &TensorInfo) -> Result<Vec<i32>> {
    if t.ty != GgmlType::I32 || t.shape.len() != 1 {
        return Err(Error::Tensor {
            tensor: t.name.clone(),
            message: format!(
                "{} {:?} (a GPU index tensor is one-dimensional I32)",
                t.ty, t.shape
            ),
        });
    }
    Ok(file
        .tensor_data(t)
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}
