//! The WGSL kernels of `shaders/`, one family per file, with the helper files each one needs
//! prepended (WGSL has no imports).

/// A kernel family: one WGSL module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shader {
    /// Dense and gathered matrix × activation products (`matvec.wgsl`).
    Matvec,
    /// The sparse down projection (`sparse_axpy.wgsl`).
    SparseAxpy,
    /// RMSNorm (`norm.wgsl`).
    Norm,
    /// RoPE (`rope.wgsl`).
    Rope,
    /// Row softmax (`softmax.wgsl`).
    Softmax,
    /// Attention over the KV cache (`attention.wgsl`).
    Attention,
    /// FFN combine, add, scale, threshold (`elementwise.wgsl`).
    Elementwise,
    /// Activation quantisation (`quantize.wgsl`).
    Quantize,
    /// KV cache append (`kv.wgsl`).
    Kv,
}

const F16: &str = include_str!("../../../shaders/f16.wgsl");
const BYTES: &str = include_str!("../../../shaders/bytes.wgsl");

impl Shader {
    /// Every kernel family.
    pub const ALL: [Shader; 9] = [
        Shader::Matvec,
        Shader::SparseAxpy,
        Shader::Norm,
        Shader::Rope,
        Shader::Softmax,
        Shader::Attention,
        Shader::Elementwise,
        Shader::Quantize,
        Shader::Kv,
    ];

    /// The kernel file's name.
    pub fn file(self) -> &'static str {
        match self {
            Shader::Matvec => "matvec.wgsl",
            Shader::SparseAxpy => "sparse_axpy.wgsl",
            Shader::Norm => "norm.wgsl",
            Shader::Rope => "rope.wgsl",
            Shader::Softmax => "softmax.wgsl",
            Shader::Attention => "attention.wgsl",
            Shader::Elementwise => "elementwise.wgsl",
            Shader::Quantize => "quantize.wgsl",
            Shader::Kv => "kv.wgsl",
        }
    }

    /// The complete WGSL source: the kernel file after the helpers it uses.
    pub fn source(self) -> String {
        let (helpers, body): (&[&str], &str) = match self {
            Shader::Matvec => (&[F16, BYTES], include_str!("../../../shaders/matvec.wgsl")),
            Shader::SparseAxpy => (
                &[F16, BYTES],
                include_str!("../../../shaders/sparse_axpy.wgsl"),
            ),
            Shader::Norm => (&[], include_str!("../../../shaders/norm.wgsl")),
            Shader::Rope => (&[], include_str!("../../../shaders/rope.wgsl")),
            Shader::Softmax => (&[], include_str!("../../../shaders/softmax.wgsl")),
            Shader::Attention => (&[F16], include_str!("../../../shaders/attention.wgsl")),
            Shader::Elementwise => (&[F16], include_str!("../../../shaders/elementwise.wgsl")),
            Shader::Quantize => (&[F16], include_str!("../../../shaders/quantize.wgsl")),
            Shader::Kv => (&[F16], include_str!("../../../shaders/kv.wgsl")),
        };
        let mut s = helpers.join("\n");
        s.push('\n');
        s.push_str(body);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses and validates `source` under `caps`, naming the file on failure.
    fn validate(file: &str, source: &str, caps: naga::valid::Capabilities) {
        let module = naga::front::wgsl::parse_str(source)
            .unwrap_or_else(|e| panic!("{file}: {}", e.emit_to_string(source)));
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .validate(&module)
            .unwrap_or_else(|e| panic!("{file}: {}", e.emit_to_string(source)));
    }

    #[test]
    fn every_shader_parses_and_validates_without_optional_features() {
        // The only capability set used: no shader-f16, no subgroups (what headless browsers and
        // wgpu's web backend offer), so every kernel runs everywhere.
        for shader in Shader::ALL {
            validate(
                shader.file(),
                &shader.source(),
                naga::valid::Capabilities::empty(),
            );
        }
    }

    #[test]
    fn a_broken_shader_is_rejected() {
        // The validator is strict enough to catch a type error (so the test above can fail).
        let broken = Shader::Softmax
            .source()
            .replace("let inv = 1.0", "let inv = 1u");
        let module = naga::front::wgsl::parse_str(&broken);
        let ok = module.is_ok_and(|m| {
            naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                naga::valid::Capabilities::empty(),
            )
            .validate(&m)
            .is_ok()
        });
        assert!(!ok);
    }
}
