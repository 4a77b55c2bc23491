//! What a cluster trains on: a memory-mapped token file larger than memory, and text through a
//! trained tokenizer.

use std::path::{Path, PathBuf};

use parcae_tests::training::*;
use parcae_tests::{LocalCluster, rss_kib, serial};

#[test]
fn a_token_file_larger_than_memory_trains_without_being_read_whole() {
    let _serial = serial();
    // 2 GiB of u16 token ids, sparse: a repeating pattern in the first MiB, zeros after it.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("train.bin");
    let pattern: Vec<u8> = (0..(1u32 << 19))
        .flat_map(|i| ((i % 61 + 1) as u16).to_le_bytes())
        .collect();
    std::fs::write(&path, &pattern).expect("write");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open")
        .set_len(2 << 30)
        .expect("grow");
    let config = train_config(
        "pin = [1, 2]",
        &format!("data = {:?}\ntokens = \"u16\"", path.display().to_string()),
    );
    let c = training_cluster(&config, 2, 12);
    assert_loss_fell(&c);
    for i in 0..2 {
        let rss_mib = rss_kib(c.nodes[i].pid().expect("running")) / 1024;
        assert!(
            rss_mib < 1024,
            "node {i} holds {rss_mib} MiB of a 2 GiB file"
        );
    }
}

/// The first node's committed losses went down from the first step to the last.
fn assert_loss_fell(c: &LocalCluster) {
    let records = steps(c, 0);
    let (first, last) = (
        records.first().expect("steps"),
        records.last().expect("steps"),
    );
    assert!(
        last.loss < first.loss,
        "loss did not fall: {} -> {}",
        first.loss,
        last.loss
    );
}

/// A byte-level BPE tokenizer trained on `corpus` by the tokenizers crate, saved as
/// `tokenizer.json` in `dir`.
fn train_tokenizer(dir: &Path, corpus: &Path, vocab: usize) -> PathBuf {
    use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::{
        DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
        TokenizerBuilder,
    };
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab)
        .min_frequency(0)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut tokenizer = TokenizerBuilder::<
        BPE,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >::new()
    .with_model(BPE::default())
    .with_pre_tokenizer(Some(ByteLevel::default().into()))
    .with_decoder(Some(ByteLevel::default().into()))
    .build()
    .expect("tokenizer");
    let path = dir.join("tokenizer.json");
    tokenizer
        .train_from_files(&mut trainer, vec![corpus.display().to_string()])
        .expect("train")
        .save(&path, false)
        .expect("save");
    path
}

#[test]
fn text_through_a_trained_tokenizer_becomes_a_token_file_the_cluster_trains_on() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let corpus = dir.path().join("corpus.txt");
    let text: String = (0..4000)
        .map(|i| {
            format!(
                "the spot cluster trains step {} of model {}\n",
                i % 17,
                i % 5
            )
        })
        .collect();
    std::fs::write(&corpus, &text).expect("corpus");
    let tokenizer_path = train_tokenizer(dir.path(), &corpus, 300);
    let out = dir.path().join("train.bin");
    let prepared = std::process::Command::new(parcae_tests::node_binary())
        .args(["prepare-data", "--tokenizer"])
        .arg(&tokenizer_path)
        .arg("--input")
        .arg(&corpus)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("prepare-data runs");
    let said = String::from_utf8_lossy(&prepared.stdout).into_owned();
    assert!(
        prepared.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&prepared.stderr)
    );
    let tokenizer = tokenizers::Tokenizer::from_file(&tokenizer_path).expect("load");
    let vocab = tokenizer.get_vocab_size(true);
    assert!(said.contains(&format!("vocab_size = {vocab}")), "{said}");
    assert!(said.contains("tokens = \"u16\""), "{said}");
    // The file is the tokenizer's encoding of every line, in order, as u16 ids.
    let expected: Vec<u8> = text
        .split_inclusive('\n')
        .flat_map(|line| {
            tokenizer
                .encode(line, false)
                .expect("encode")
                .get_ids()
                .to_vec()
        })
        .flat_map(|id| u16::try_from(id).expect("u16 id").to_le_bytes())
        .collect();
    assert_eq!(std::fs::read(&out).expect("token file"), expected);

    // GPT-2 124M's structure at width 64, with a tenth of the file held out.
    let config = train_config(
        "pin = [1, 2]",
        &format!(
            "data = {:?}\ntokens = \"u16\"\nvocab_size = {vocab}\nmodel = \"gpt2-124m\"\n\
             d_model = 64\nn_heads = 4\nd_ff = 256\nseq_len = 32\nval_fraction = 0.1\n\
             val_every = 4\nval_samples = 16",
            out.display().to_string()
        ),
    );
    let c = training_cluster(&config, 2, 12);
    assert_loss_fell(&c);
    let validation: Vec<(u64, f64)> = steps(&c, 0)
        .iter()
        .filter_map(|r| Some((r.step, r.validation_loss?)))
        .collect();
    assert_eq!(
        validation.iter().map(|v| v.0).take(4).collect::<Vec<_>>(),
        [0, 4, 8, 12],
        "steps 0, 4, 8, 12 evaluate and no other"
    );
    let (first, last) = (validation[0].1, validation[validation.len() - 1].1);
    assert!(
        last < first,
        "validation loss did not fall: {first} -> {last}"
    );
    let status = c.nodes[0].status().expect("status");
    assert!(status.validation_loss.is_some() && status.validation_step.is_some());
}
