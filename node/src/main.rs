//! `parcae-node`: run a node, make a cluster key, tokenize a corpus, export the trained model,
//! profile a model on this machine's device, check and benchmark the device, or query a node's
//! status.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use parcae_api::client::Client;
use parcae_model::{
    ByteTextDataset, Dataset, Gpt, Gpt2Safetensors, GptConfig, SyntheticTask, TokenDtype,
    TokenFileDataset, WeightSource,
};
use parcae_node::Trainer;
use parcae_node::adopt;
use parcae_node::assembly::{self, RunArgs};
use parcae_node::config::{JobSource, NodeConfig};
use parcae_node::device_info::burn_device;
use parcae_node::export::{ExportOptions, export};
use parcae_node::key::ClusterKey;
use parcae_node::learn::{LearnOptions, learn};
use parcae_node::planner_bench::time_decision;
use parcae_node::prepare::{PrepareOptions, prepare};
use parcae_node::profile::{ProfileOptions, profile};
use parcae_node::replay::{ReplayJob, ReplayOptions, read_steps, replay};
use parcae_node::smoke::{SmokeOptions, smoke};
use parcae_node::train::TrainerLauncher;
use parcae_node::train_bench::{TrainBenchOptions, train_bench};

/// Burn allocates a fresh buffer for every tensor operation; glibc's allocator hands large ones
/// back to the kernel and faults them in again (page faults, zeroing and TLB shootdowns took
/// ~15% of a `small` training step); mimalloc keeps them in per-thread pages (step 10% faster).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (its index in `mi_option_t`, mimalloc.h v2 and v3; the
/// Rust bindings name no constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keeps freed memory in mimalloc's arenas instead of handing it back to the kernel. A training
/// step frees and allocates the same large buffers every step; purged after mimalloc's default
/// delay, they came back as fresh pages the kernel had to zero (`clear_page_erms` was 13-16 % of
/// a `small` step's samples); kept, the step is ~7 % faster (0.96 -> 0.89 s median). The cost is
/// that the process keeps its peak heap, as PyTorch's caching allocator does.
fn keep_freed_memory() {
    // SAFETY: sets a plain integer option; mimalloc reads it when it next decides to purge.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

#[derive(Parser)]
#[command(
    name = "parcae-node",
    version,
    about = "Parcae-rs node: spot-instance training cluster member"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node.
    Run(RunArgs),
    /// Create a new cluster key file.
    Keygen {
        /// Where to write the key (must not exist).
        #[arg(long, env = "PARCAE_OUT")]
        out: PathBuf,
    },
    /// Tokenize text or JSONL with a Hugging Face tokenizer.json into a token file for
    /// `[train] data` (offline; streams, so any size).
    PrepareData(PrepareOptions),
    /// Write the model the checkpoints of a step describe as one safetensors file with
    /// Hugging Face GPT-2 tensor names.
    Export(ExportOptions),
    /// Train a cluster's committed steps again in this process, from each stored checkpoint to
    /// the next, and compare the weights: the cluster trained what one process would have.
    Replay(ReplayOptions),
    /// Measure a model on this machine's device (per-layer forward, backward and optimizer
    /// times, bytes, peak memory) into a profile file the planner and the emulator read.
    Profile(ProfileOptions),
    /// Compare a device with the CPU: a few tensor operations and one training step of a small
    /// GPT from the same weights (the first command on a new GPU).
    Smoke(SmokeOptions),
    /// Train the whole model in this process for some steps at a fixed batch: tokens/s, MFU,
    /// peak memory, the cold start apart from the warm steps.
    TrainBench(TrainBenchOptions),
    /// Train the job in this process as groups that synchronise every step or every H steps
    /// (DiLoCo), at equal samples: validation loss against samples, bytes between groups.
    Learn(LearnOptions),
    /// Time the leader's whole decision (the default strategy over pools of unlike speeds):
    /// cold, as a fresh planner makes it, and memoised, as the next one is made.
    BenchPlanner(BenchPlannerArgs),
    /// Print a running node's /status.
    Status {
        /// The node's status address, e.g. 127.0.0.1:9000.
        #[arg(long, env = "PARCAE_ADDR")]
        addr: SocketAddr,
    },
}

/// `parcae-node bench-planner`.
#[derive(clap::Args)]
struct BenchPlannerArgs {
    /// Workers planned over.
    #[arg(long, default_value_t = 512)]
    nodes: u32,
    /// Pools they are dealt over, in join order.
    #[arg(long, default_value_t = 4)]
    pools: u32,
    /// Decisions timed each way (the medians are reported).
    #[arg(long, default_value_t = 5)]
    repeats: u32,
    /// Where to write the result as JSON (`cold_ms`, `memoised_ms`, ...).
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    keep_freed_memory();
    parcae_node::process::init_logging();
    parcae_node::clock::init_from_env()?;
    match Cli::parse().command {
        Command::Run(args) => {
            let opts = args.load()?;
            let opts = match opts.config.train.job {
                _ if !opts.config.train.enabled => opts,
                JobSource::Own => {
                    let trainer = builtin_trainer(&opts.config)?;
                    opts.with_trainer(trainer)
                }
                JobSource::Adopt => {
                    let config = opts.config.clone();
                    opts.adopting(Box::new(move |job| {
                        let adopted = adopt::adopted(&config, job).map_err(|e| e.to_string())?;
                        builtin_trainer(&adopted).map_err(|e| format!("{e:#}"))
                    }))
                }
            };
            std::process::exit(assembly::run(opts)?);
        }
        Command::Keygen { out } => {
            let key = ClusterKey::generate();
            key.store(&out)?;
            println!(
                "wrote {} (fingerprint {})",
                out.display(),
                key.fingerprint()
            );
            Ok(())
        }
        Command::PrepareData(opts) => {
            let done = prepare(&opts)?;
            let width = match done.dtype {
                TokenDtype::U16 => "u16",
                TokenDtype::U32 => "u32",
            };
            println!(
                "wrote {} tokens to {} (sha256 {})
[train]
data = {:?}
tokens = \"{width}\"
vocab_size = {}",
                done.tokens,
                opts.out.display(),
                done.sha256,
                opts.out.display().to_string(),
                done.vocab_size
            );
            Ok(())
        }
        Command::Export(opts) => {
            let done = export(&opts)?;
            println!(
                "wrote the model after {} steps ({} stage checkpoints, layers {:?}) to {} (sha256 {})",
                done.step,
                done.parts.len(),
                done.parts,
                opts.out.display(),
                done.sha256
            );
            Ok(())
        }
        Command::Replay(opts) => replay_command(&opts),
        Command::Profile(opts) => {
            let p = profile(&opts)?;
            let step_ms: f64 = p
                .layers
                .iter()
                .map(|l| l.forward_ms + l.backward_ms + l.optimizer_ms)
                .sum();
            println!(
                "wrote {} ({} on {}: {} layers, micro-batch {} x {} tokens, {step_ms:.1} ms \
                 forward+backward+optimizer per micro-batch, peak memory {:.0} MiB)",
                opts.out.display(),
                p.model,
                p.device,
                p.layers.len(),
                p.micro_batch,
                p.seq_len,
                p.peak_memory_bytes as f64 / (1024.0 * 1024.0)
            );
            Ok(())
        }
        Command::Smoke(opts) => {
            let s = smoke(&opts)?;
            for c in &s.report.checks {
                println!(
                    "{:<28} max |diff| {:.3e} (reference max {:.3e}) {}",
                    c.name,
                    c.max_abs_diff,
                    c.reference_max_abs,
                    if c.passed { "ok" } else { "FAILED" }
                );
            }
            println!("wrote {}", opts.out.display());
            if !s.report.passed {
                anyhow::bail!(
                    "{} differs from Flex beyond the tolerance {}",
                    s.device,
                    s.report.tolerance
                );
            }
            Ok(())
        }
        Command::TrainBench(opts) => {
            let r = train_bench(&opts)?;
            println!(
                "wrote {} ({} on {}: {:.0} tokens/s warm, cold start {:.1} s, loss {:.3} -> {:.3})",
                opts.out.display(),
                r.model,
                r.device,
                r.tokens_per_s,
                r.cold_start_s,
                r.losses.first().copied().unwrap_or(f32::NAN),
                r.losses.last().copied().unwrap_or(f32::NAN)
            );
            Ok(())
        }
        Command::Learn(opts) => {
            let r = learn(&opts)?;
            println!(
                "wrote {} ({} runs of {} parameters)",
                opts.out.display(),
                r.runs.len(),
                r.params
            );
            Ok(())
        }
        Command::BenchPlanner(args) => {
            let t = time_decision(args.nodes, args.pools, args.repeats)?;
            let json = serde_json::to_string_pretty(&t)?;
            if let Some(path) = &args.json {
                std::fs::write(path, &json)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            println!("{json}");
            Ok(())
        }
        Command::Status { addr } => {
            let status = Client::with_timeout(Duration::from_secs(5)).status(addr)?;
            println!("{}", serde_json::to_string_pretty(&status)?);
            Ok(())
        }
    }
}

/// The built-in GPT on the synthetic task or a byte-level text file, as `[train]` says, on the
/// device `[device]` names.
fn builtin_trainer(config: &NodeConfig) -> anyhow::Result<TrainerLauncher> {
    let t = &config.train;
    let (gpt, data) = builtin_data(config)?;
    let mut trainer = Trainer::with_shared_dataset(Gpt::new(gpt.clone())?, data);
    if let Some(weights) = builtin_init(config, &gpt)? {
        trainer = trainer.initial_weights(weights);
    }
    if let Some(store) = &t.checkpoint_store {
        trainer = trainer.checkpoint_store(store);
    }
    if let Some(from) = &t.restore {
        trainer = trainer.restore_from(from);
    }
    if let Some(emulation) = config.device.emulation()? {
        trainer = trainer.emulate(emulation);
    }
    Ok(trainer
        .job_settings(adopt::recipe(config)?)
        .spec(t.job_spec())
        .keep_checkpoints(t.keep_checkpoints)
        .device(config.device.burn_device()?)
        .launcher())
}

/// The built-in GPT's sizes and its data: the synthetic task, a token file or a byte-level
/// text file, as `[train]` says.
fn builtin_data(config: &NodeConfig) -> anyhow::Result<(GptConfig, Arc<dyn Dataset>)> {
    let t = &config.train;
    let gpt = config.model();
    let data: Arc<dyn Dataset> = if t.data == "synthetic" {
        Arc::new(SyntheticTask::default_for(
            t.seed,
            gpt.vocab_size,
            gpt.seq_len,
        )?)
    } else if let Some(dtype) = t.tokens {
        let path = std::path::Path::new(&t.data);
        Arc::new(
            TokenFileDataset::open(path, dtype.into(), gpt.seq_len, gpt.vocab_size)
                .with_context(|| format!("train.data {}", t.data))?,
        )
    } else {
        Arc::new(
            ByteTextDataset::from_file(std::path::Path::new(&t.data), gpt.seq_len)
                .with_context(|| format!("train.data {}", t.data))?,
        )
    };
    Ok((gpt, data))
}

/// The weights `[train] init` starts the built-in GPT from, if any.
fn builtin_init(
    config: &NodeConfig,
    gpt: &GptConfig,
) -> anyhow::Result<Option<Arc<dyn WeightSource>>> {
    let Some(init) = &config.train.init else {
        return Ok(None);
    };
    let weights = Gpt2Safetensors::open(std::path::Path::new(init), gpt)
        .with_context(|| format!("train.init {init}"))?;
    Ok(Some(Arc::new(weights)))
}

/// `parcae-node replay` on the built-in GPT: prints the verdict, writes the report, fails when
/// the check does.
fn replay_command(opts: &ReplayOptions) -> anyhow::Result<()> {
    let config = match &opts.config {
        Some(path) => NodeConfig::load(path)?,
        None => NodeConfig::default(),
    };
    let location = opts
        .store
        .clone()
        .or_else(|| config.train.checkpoint_store.clone())
        .context("--store: the configuration names no [train] checkpoint_store")?;
    let (gpt, dataset) = builtin_data(&config)?;
    let job = ReplayJob {
        initial_weights: builtin_init(&config, &gpt)?,
        model: Arc::new(Gpt::new(gpt)?),
        dataset,
        spec: config.train.job_spec(),
        program_settings: adopt::recipe(&config)?,
        device: burn_device(opts.device, false)?,
    };
    let steps = read_steps(&opts.steps)?;
    let report = replay(&job, &location, &steps, opts.tolerance, opts.max_window)?;
    println!(
        "replay {}: {} windows, {} steps replayed ({} not), max |diff| {:.3e} (tolerance {:.0e}), \
         max loss diff {:.3e}",
        if report.passed { "passed" } else { "FAILED" },
        report.windows,
        report.steps_replayed,
        report.steps_not_replayed,
        report.max_abs_diff,
        report.tolerance,
        report.max_loss_diff
    );
    for p in &report.problems {
        println!("  {p}");
    }
    if let Some(path) = &opts.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| path.display().to_string())?;
    }
    anyhow::ensure!(report.passed, "the replay check failed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purge_delay_option_is_the_one_set() {
        // SAFETY: reads an integer option.
        let get = || unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(get(), 1000, "index 15 is not mimalloc v3's purge_delay");
        }
        keep_freed_memory();
        assert_eq!(get(), -1);
    }
}
