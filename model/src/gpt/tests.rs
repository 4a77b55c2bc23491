use super::*;
use crate::stage::init_layers;

#[test]
fn a_config_round_trips_through_burns_json() {
    let path = std::env::temp_dir().join(format!("gpt-config-{}.json", std::process::id()));
    GptConfig::small().save(&path).unwrap();
    let loaded = GptConfig::load(&path);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(loaded.unwrap(), GptConfig::small());
    let text = GptConfig::tiny().to_string();
    assert!(text.contains("\"d_model\": 32"), "{text}");
}

fn logits(model: &Gpt, layers: &[GptLayer], tokens: Vec<i64>) -> Vec<f32> {
    let device = Device::flex();
    let t = tokens.len();
    let mut x = Activation::Tokens(Tensor::from_data(TensorData::new(tokens, [1, t]), &device));
    let mut rng = StageRng::from_seed_u64(0);
    for (i, l) in layers.iter().enumerate() {
        x = model.forward(i, l, x, &mut rng).unwrap();
    }
    let out = x.into_hidden("logits").unwrap();
    out.into_data().try_into_vec_as::<f32>().unwrap()
}

/// Every value of `b` within `tol` of `a`'s (relative to `a`'s largest).
fn assert_close(what: &str, a: Tensor<2>, b: Tensor<2>, tol: f32) {
    let (a, b) = (
        a.into_data().try_to_vec::<f32>().unwrap(),
        b.into_data().try_to_vec::<f32>().unwrap(),
    );
    assert_eq!(a.len(), b.len(), "{what}");
    let scale = a.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            (x - y).abs() <= tol * scale,
            "{what}[{i}]: composed {x}, fused {y}"
        );
    }
}

#[test]
fn the_fused_block_computes_the_composed_blocks_output_and_every_gradient() {
    for gelu in [Gelu::Erf, Gelu::Tanh] {
        let composed = Gpt::new(GptConfig {
            d_model: 16,
            n_heads: 2,
            d_ff: 32,
            seq_len: 8,
            gelu,
            ..GptConfig::tiny()
        })
        .unwrap();
        let fused = Gpt::new(GptConfig {
            kernel: BlockKernel::Fused,
            ..composed.config().clone()
        })
        .unwrap();
        let device = Device::flex().autodiff();
        let GptLayer::Block(block) = init_layers(&composed, 1..2, 3, &device).remove(0) else {
            panic!("layer 1 is a block");
        };
        let x = Tensor::<3>::random([3, 7, 16], burn::tensor::Distribution::Default, &device)
            .require_grad();
        let dy = Tensor::<3>::random([3, 7, 16], burn::tensor::Distribution::Default, &device);
        assert!(fused_block::supports(&x), "the fused block runs on Flex");
        let run = |model: &Gpt| {
            let y = model.block(&block, x.clone());
            let grads = (y.clone() * dy.clone()).sum().backward();
            let flat = |t: Tensor<3>| t.reshape([21, 16]);
            let two = |p: &burn::module::Param<Tensor<2>>| p.val().grad(&grads).unwrap();
            let one =
                |p: &burn::module::Param<Tensor<1>>| p.val().grad(&grads).unwrap().unsqueeze::<2>();
            let bias = |l: &Linear| one(l.bias.as_ref().unwrap());
            let beta = |n: &LayerNorm| one(n.beta.as_ref().unwrap());
            vec![
                ("output", flat(y.inner())),
                ("input", flat(x.grad(&grads).unwrap())),
                ("ln_attn gamma", one(&block.ln_attn.gamma)),
                ("ln_attn beta", beta(&block.ln_attn)),
                ("qkv weight", two(&block.qkv.weight)),
                ("qkv bias", bias(&block.qkv)),
                ("proj weight", two(&block.proj.weight)),
                ("proj bias", bias(&block.proj)),
                ("ln_mlp gamma", one(&block.ln_mlp.gamma)),
                ("ln_mlp beta", beta(&block.ln_mlp)),
                ("fc_in weight", two(&block.fc_in.weight)),
                ("fc_in bias", bias(&block.fc_in)),
                ("fc_out weight", two(&block.fc_out.weight)),
                ("fc_out bias", bias(&block.fc_out)),
            ]
        };
        for ((what, a), (_, b)) in run(&composed).into_iter().zip(run(&fused)) {
            assert_close(&format!("{what} ({gelu:?})"), a, b, 1e-4);
        }
        let plain = Device::flex();
        let block = block.clone().valid();
        let x = x.inner().to_device(&plain);
        assert_close(
            "output without autodiff",
            composed.block(&block, x.clone()).reshape([21, 16]),
            fused.block(&block, x).reshape([21, 16]),
            1e-5,
        );
    }
}

#[test]
fn presets_have_the_documented_sizes() {
    let tiny = Gpt::new(GptConfig::tiny()).unwrap();
    let layers = init_layers(&tiny, 0..tiny.num_layers(), 0, &Device::flex());
    let n: usize = layers.iter().map(|l| l.num_params()).sum();
    assert_eq!(n, 30_080);
    assert_eq!(tiny.layer_name(3), "head");
    assert!(Gpt::new(GptConfig::small()).is_ok());
    let bad = GptConfig {
        n_heads: 5,
        ..GptConfig::tiny()
    };
    assert!(matches!(Gpt::new(bad), Err(ModelError::InvalidConfig(_))));
}

#[test]
fn counted_params_match_the_built_layers() {
    for config in [GptConfig::tiny(), GptConfig::small()] {
        let model = Gpt::new(config).unwrap();
        let layers = init_layers(&model, 0..model.num_layers(), 0, &Device::flex());
        for (i, layer) in layers.iter().enumerate() {
            assert_eq!(model.layer_params(i), layer.num_params(), "layer {i}");
        }
    }
    assert_eq!(Gpt::new(GptConfig::tiny()).unwrap().num_params(), 30_080);
}

#[test]
fn gpt2_presets_count_hugging_face_s_parameters_plus_the_untied_head() {
    // Published totals (tied): gpt2, -medium, -large, -xl.
    let published = [
        (GptConfig::gpt2_124m(), 124_439_808),
        (GptConfig::gpt2_355m(), 354_823_168),
        (GptConfig::gpt2_774m(), 774_030_080),
        (GptConfig::gpt2_1558m(), 1_557_611_200),
    ];
    for (config, tied) in published {
        let head = config.vocab_size * config.d_model;
        let model = Gpt::new(config).unwrap();
        assert_eq!(model.num_params(), tied + head);
        assert!(model.architecture().ends_with("gelu-tanh"));
    }
}

#[test]
fn attention_is_causal() {
    let model = Gpt::new(GptConfig::tiny()).unwrap();
    let layers = init_layers(&model, 0..model.num_layers(), 3, &Device::flex());
    let a = logits(&model, &layers, vec![1, 2, 3, 4, 5, 6, 7, 8]);
    let b = logits(&model, &layers, vec![1, 2, 3, 4, 5, 9, 9, 9]);
    let v = model.config().vocab_size;
    assert_eq!(
        a[..5 * v],
        b[..5 * v],
        "a later token changed an earlier output"
    );
    assert_ne!(a[5 * v..6 * v], b[5 * v..6 * v]);
}
