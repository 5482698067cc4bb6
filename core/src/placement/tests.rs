use super::cost::{predict, Devices};
use super::gpuidx::GpuIndex;
use super::known::{predict_setup, setups};
use super::*;
use crate::gguf::GgufFile;
use crate::synth::rng::Rng;

/// A small random instance: frequencies are multiples of 1/8 and sizes small integers, so every
/// objective value is exact in f64 whatever the summation order.
fn random_problem(rng: &mut Rng, max_neurons: usize) -> Problem {
    let n_layer = 1 + rng.below(3);
    let mut left = max_neurons;
    let layers = (0..n_layer)
        .map(|_| {
            let n = rng.below(left.min(5) + 1);
            left -= n;
            Layer {
                neuron_bytes: [0, 1, 2, 3, 5][rng.below(5)],
                frequencies: (0..n).map(|_| rng.below(9) as f32 / 8.0).collect(),
                dense_bytes: rng.below(8) as u64,
            }
        })
        .collect();
    let globals = (0..rng.below(3))
        .map(|g| {
            let bytes = rng.below(8) as u64;
            GlobalTensor {
                name: format!("g{g}"),
                bytes,
                read_bytes: rng.below(bytes as usize + 1) as u64,
            }
        })
        .collect();
    let mut p = Problem {
        layers,
        globals,
        budget: 0,
    };
    p.budget = rng.below(p.total_bytes() as usize + 3) as u64;
    p
}

/// The best objective value over every subset of neurons, every `m` and every subset of globals.
fn brute_force(p: &Problem) -> f64 {
    let neurons: Vec<(u64, f64)> = p
        .layers
        .iter()
        .flat_map(|l| {
            l.frequencies
                .iter()
                .map(|&f| (l.neuron_bytes, f64::from(f) * l.neuron_bytes as f64))
        })
        .collect();
    let n_layer = p.layers.len();
    let mut best = f64::NEG_INFINITY;
    for nmask in 0u32..(1 << neurons.len()) {
        let (mut bytes, mut value) = (0u64, 0.0);
        for (i, &(b, v)) in neurons.iter().enumerate() {
            if nmask & (1 << i) != 0 {
                bytes += b;
                value += v;
            }
        }
        for gmask in 0u32..(1 << p.globals.len()) {
            let (mut gb, mut gv) = (bytes, value);
            for (g, t) in p.globals.iter().enumerate() {
                if gmask & (1 << g) != 0 {
                    gb += t.bytes;
                    gv += t.read_bytes as f64;
                }
            }
            for m in 0..=n_layer {
                let d: u64 = p.layers[n_layer - m..].iter().map(|l| l.dense_bytes).sum();
                if gb + d <= p.budget {
                    best = best.max(gv + d as f64);
                }
            }
        }
    }
    best
}

/// Recomputes a plan's bytes and value from its choices, and checks its shape.
fn check_plan(p: &Problem, plan: &Plan) {
    assert_eq!(plan.hot.len(), p.layers.len());
    let mut bytes = 0u64;
    let mut value = 0.0;
    for (l, hot) in p.layers.iter().zip(&plan.hot) {
        assert!(hot.windows(2).all(|w| w[0] < w[1]), "hot ids ascending");
        for &i in hot {
            bytes += l.neuron_bytes;
            value += f64::from(l.frequencies[i as usize]) * l.neuron_bytes as f64;
        }
    }
    let n_layer = p.layers.len();
    let m = plan.dense_on_gpu.iter().filter(|&&d| d).count();
    assert!(
        plan.dense_on_gpu[n_layer - m..].iter().all(|&d| d),
        "a suffix"
    );
    for l in &p.layers[n_layer - m..] {
        bytes += l.dense_bytes;
        value += l.dense_bytes as f64;
    }
    for (g, &on) in p.globals.iter().zip(&plan.globals_on_gpu) {
        if on {
            bytes += g.bytes;
            value += g.read_bytes as f64;
        }
    }
    assert_eq!(bytes, plan.gpu_bytes);
    assert!(bytes <= p.budget, "{bytes} over the budget {}", p.budget);
    assert_eq!(value, plan.served_bytes);
}

#[test]
fn solver_matches_brute_force() {
    let mut rng = Rng::new(7);
    for case in 0..4000 {
        let p = random_problem(&mut rng, 12);
        let plan = solve(&p).unwrap();
        check_plan(&p, &plan);
        assert_eq!(plan.served_bytes, brute_force(&p), "case {case}: {p:?}");
    }
}

#[test]
fn budget_zero_places_nothing_and_a_huge_budget_places_everything() {
    let mut rng = Rng::new(3);
    for _ in 0..200 {
        let mut p = random_problem(&mut rng, 12);
        p.budget = 0;
        let plan = solve(&p).unwrap();
        // only zero-byte items can be placed for free
        assert_eq!(plan.gpu_bytes, 0);
        p.budget = u64::MAX / 2;
        let plan = solve(&p).unwrap();
        assert_eq!(plan.gpu_bytes, p.total_bytes());
        for (l, hot) in p.layers.iter().zip(&plan.hot) {
            assert_eq!(hot.len(), l.frequencies.len());
        }
    }
}

#[test]
fn hot_neurons_are_the_most_frequent() {
    let p = Problem {
        layers: vec![Layer {
            neuron_bytes: 10,
            frequencies: vec![0.1, 0.9, 0.5, 0.7],
            dense_bytes: 0,
        }],
        globals: vec![],
        budget: 25,
    };
    let plan = solve(&p).unwrap();
    assert_eq!(plan.hot, vec![vec![1, 3]]);
    let share = plan.layer_gpu_share(&p);
    assert!((share[0] - 1.6 / 2.2).abs() < 1e-6);
}

#[test]
fn bad_frequencies_are_refused() {
    for bad in [1.5f32, -0.1, f32::NAN] {
        let p = Problem {
            layers: vec![Layer {
                neuron_bytes: 1,
                frequencies: vec![0.5, bad],
                dense_bytes: 0,
            }],
            globals: vec![],
            budget: 1,
        };
        let e = solve(&p).unwrap_err().to_string();
        assert!(e.contains("outside [0, 1]"), "{e}");
    }
}

#[test]
fn cost_model_orders_plans_by_bandwidth() {
    let devices = Devices {
        gpu_bandwidth: 1000.0,
        cpu_bandwidth: 100.0,
        bus_bandwidth: 1e12,
        bus_latency: 0.0,
    };
    let p = Problem {
        layers: vec![Layer {
            neuron_bytes: 100,
            frequencies: vec![1.0, 0.5],
            dense_bytes: 1000,
        }],
        globals: vec![],
        budget: 0,
    };
    let cpu = predict(&p, &solve(&p).unwrap(), &devices, 4).unwrap();
    // all on the CPU: (1000 + 150) bytes at 100 B/s
    assert!((cpu.seconds_per_token - 11.5).abs() < 1e-9);
    let all = Problem {
        budget: 10_000,
        ..p.clone()
    };
    let gpu = predict(&all, &solve(&all).unwrap(), &devices, 4).unwrap();
    assert!((gpu.seconds_per_token - 1.15).abs() < 1e-6);
    assert_eq!(gpu.transfers, 2);
    // hot neuron 0 on the GPU (100 B at 1000 B/s) overlaps cold neuron 1 (50 B at 100 B/s)
    let split = Problem {
        budget: 100,
        ..p.clone()
    };
    let plan = solve(&split).unwrap();
    assert_eq!(plan.hot, vec![vec![0]]);
    let mixed = predict(&split, &plan, &devices, 4).unwrap();
    assert!((mixed.seconds_per_token - (10.0 + 0.5)).abs() < 1e-6);
    let bad = Devices {
        cpu_bandwidth: 0.0,
        ..devices
    };
    assert!(predict(&p, &solve(&p).unwrap(), &bad, 4).is_err());
}

#[test]
fn falcon_40b_plan_fills_the_budget_and_beats_dense() {
    let setup = &setups()[0];
    assert_eq!(setup.model.n_layer * setup.model.n_ff, 60 * 32768);
    let p = setup.problem().unwrap();
    let plan = solve(&p).unwrap();
    check_plan(&p, &plan);
    assert!(plan.gpu_bytes <= setup.budget && plan.gpu_bytes > setup.budget * 9 / 10);
    let r = predict_setup(setup, &p, &plan).unwrap();
    assert!(r.sparse.tokens_per_second > r.dense.tokens_per_second);
    assert!(r.gpu_share > 0.5 && r.gpu_share < 1.0, "{}", r.gpu_share);
}

#[test]
fn gpuidx_round_trips() {
    let index = GpuIndex {
        n_neurons: vec![8, 8, 4, 0],
        hot: vec![vec![1, 3, 4], vec![], vec![0, 1, 2, 3], vec![]],
        vram_capacity: 123_456_789,
    };
    let bytes = index.to_bytes().unwrap();
    assert_eq!(&bytes[..4], b"PWRI");
    let file = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(GpuIndex::read(&file).unwrap(), index);
    assert_eq!(
        file.get_str("general.architecture").unwrap(),
        Some(gpuidx::ARCHITECTURE)
    );
}

/// `testdata/powerinfer.gpuidx` was written by PowerInfer's own `gguf-py` following its
/// `export_split.py` (see `testdata/gen_gpuidx.py`): the writer must give the same bytes.
#[test]
fn gpuidx_matches_powerinfer_writer() {
    let reference: &[u8] = include_bytes!("testdata/powerinfer.gpuidx");
    let index = GpuIndex {
        n_neurons: vec![8, 8, 4],
        hot: vec![vec![1, 3, 4], vec![], vec![0, 1, 2, 3]],
        vram_capacity: 123_456_789,
    };
    assert_eq!(index.to_bytes().unwrap(), reference);
    let file = GgufFile::from_bytes(reference.to_vec()).unwrap();
    assert_eq!(GpuIndex::read(&file).unwrap(), index);
}

#[test]
fn gpuidx_rejects_inconsistent_files() {
    let bad = GpuIndex {
        n_neurons: vec![4],
        hot: vec![vec![2, 1]],
        vram_capacity: 0,
    };
    assert!(bad.to_bytes().is_err());
    let out_of_range = GpuIndex {
        n_neurons: vec![4],
        hot: vec![vec![4]],
        vram_capacity: 0,
    };
    assert!(out_of_range.to_bytes().is_err());
    // a bucket that disagrees with its index
    let mut w = crate::gguf::GgufWriter::new(crate::gguf::Magic::PowerInfer);
    w.set(gpuidx::VRAM_CAPACITY_KEY, crate::gguf::MetaValue::U64(1));
    let i32s = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    w.add_tensor(
        "blk.0.gpu_idx",
        crate::quant::GgmlType::I32,
        &[3],
        i32s(&[1, 0, 1]),
    )
    .unwrap();
    w.add_tensor(
        "blk.0.gpu_bucket",
        crate::quant::GgmlType::I32,
        &[2],
        i32s(&[0, 1]),
    )
    .unwrap();
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let e = GpuIndex::read(&file).unwrap_err().to_string();
    assert!(e.contains("does not list"), "{e}");
}

/// Sizes come from the tensor table: per-layer neuron bytes follow each layer's types, and a tied
/// embedding (no `output.weight`) is read whole every token.
#[test]
fn problem_from_gguf_sizes_neurons_by_type() {
    use crate::quant::GgmlType;
    let (e, ff) = (32u64, 4u64);
    let mut w = crate::gguf::GgufWriter::new(crate::gguf::Magic::Gguf);
    let mut add = |name: &str, ty: GgmlType, shape: &[u64]| {
        let rows: u64 = shape[1..].iter().product();
        let n = (ty.row_bytes(shape[0]).unwrap() * rows) as usize;
        w.add_tensor(name, ty, shape, vec![0u8; n]).unwrap();
    };
    add("token_embd.weight", GgmlType::Q8_0, &[e, 10]);
    for (il, ty) in [(0, GgmlType::F16), (1, GgmlType::Q4_0)] {
        add(&format!("blk.{il}.attn_q.weight"), ty, &[e, e]);
        add(&format!("blk.{il}.attn_norm.weight"), GgmlType::F32, &[e]);
        add(&format!("blk.{il}.ffn_gate.weight"), ty, &[e, ff]);
        add(&format!("blk.{il}.ffn_up.weight"), ty, &[e, ff]);
        add(
            &format!("blk.{il}.ffn_down_t.weight"),
            GgmlType::Q8_0,
            &[e, ff],
        );
    }
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let freqs = vec![vec![0.5; ff as usize]; 2];
    let p = Problem::from_gguf(&file, freqs, 1000).unwrap();
    assert_eq!(p.layers[0].neuron_bytes, 2 * 64 + 34);
    assert_eq!(p.layers[1].neuron_bytes, 2 * 18 + 34);
    assert_eq!(p.layers[0].dense_bytes, 32 * 64 + 128);
    assert_eq!(p.layers[1].dense_bytes, 32 * 18 + 128);
    assert_eq!(p.globals.len(), 1);
    assert_eq!(p.globals[0].bytes, 10 * 34);
    assert_eq!(
        p.globals[0].read_bytes,
        10 * 34,
        "tied: the LM head reads it all"
    );
    let total: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    assert_eq!(p.total_bytes(), total);
    // wrong statistics shape
    let e = Problem::from_gguf(&file, vec![vec![0.5; 3]; 2], 0).unwrap_err();
    assert!(
        e.to_string().contains("3 activation frequencies for 4"),
        "{e}"
    );
}

#[test]
fn too_many_cost_classes_are_refused_not_hung() {
    let layer = |neuron_bytes| Layer {
        neuron_bytes,
        frequencies: vec![0.5; 100_000],
        dense_bytes: 0,
    };
    let p = Problem {
        layers: vec![layer(1), layer(2), layer(3), layer(4)],
        globals: vec![],
        budget: 1 << 20,
    };
    let e = solve(&p).unwrap_err().to_string();
    assert!(e.contains("neuron-cost classes"), "{e}");
}

#[test]
fn relu_file_without_statistics_is_refused_clearly() {
    let mut w = crate::gguf::GgufWriter::new(crate::gguf::Magic::PowerInfer);
    w.set(
        "general.architecture",
        crate::gguf::MetaValue::String("llama".into()),
    );
    w.set(
        "hotcold.ffn_activation",
        crate::gguf::MetaValue::String("relu".into()),
    );
    w.add_tensor(
        "blk.0.ffn_up.weight",
        crate::quant::GgmlType::F32,
        &[2, 3],
        vec![0u8; 24],
    )
    .unwrap();
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let e = stats::frequencies(&file).unwrap_err().to_string();
    assert!(e.contains("hotcold calibrate"), "{e}");
    let empty = crate::gguf::GgufWriter::new(crate::gguf::Magic::Gguf);
    let file = GgufFile::from_bytes(empty.to_bytes().unwrap()).unwrap();
    let e = stats::frequencies(&file).unwrap_err().to_string();
    assert!(e.contains("no FFN blocks"), "{e}");
}
