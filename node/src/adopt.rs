//! A joiner's `[train]` from the cluster's job (`[train] job = "adopt"`).
//!
//! A job that `parcae-node` defines carries its [`JobSpec`] (seed, batches, step limit,
//! checkpoint cadence, learning rate, validation) and, as program settings, the model's
//! `[train]` keys as `train.<key>` TOML values ([`recipe`]). A node that adopts the job waits
//! for it, then trains with its values, except for the keys its own file sets ([`adopted`]):
//! those stay, and where they differ from the job the node is refused like any other whose job
//! differs. What is the node's own (its data file, the token width, starting weights, store,
//! timeouts, port) never comes from the job; the data file is still checked against the job's
//! hash.

use parcae_consensus::state::Job;

use crate::config::{ConfigError, NodeConfig, TrainConfig};
use crate::job::JobSpec;

/// The `[train]` keys of the model, carried as the job's program settings.
pub const MODEL_KEYS: [&str; 7] = [
    "model",
    "vocab_size",
    "d_model",
    "n_heads",
    "n_blocks",
    "d_ff",
    "seq_len",
];

/// The `[train]` keys the job's spec carries ([`TrainConfig::with_spec`]).
const SPEC_KEYS: [&str; 10] = [
    "seed",
    "global_batch",
    "micro_batch",
    "max_steps",
    "checkpoint_every",
    "peak_lr",
    "warmup_steps",
    "val_fraction",
    "val_every",
    "val_samples",
];

/// Prefix of the job settings that carry `[train]` keys.
const PREFIX: &str = "train.";

fn invalid(reason: String) -> ConfigError {
    ConfigError::Invalid(format!("the cluster's job: {reason}"))
}

/// The program settings of `config`'s `[train]`: every model key as a TOML value, the model's
/// sizes resolved (so two files that spell the same model differently agree).
pub fn recipe(config: &NodeConfig) -> Result<Vec<(String, String)>, ConfigError> {
    let gpt = config.model();
    let train = TrainConfig {
        vocab_size: Some(gpt.vocab_size),
        d_model: Some(gpt.d_model),
        n_heads: Some(gpt.n_heads),
        n_blocks: Some(gpt.n_blocks),
        d_ff: Some(gpt.d_ff),
        seq_len: Some(gpt.seq_len),
        ..config.train.clone()
    };
    let table = train_table(&train)?;
    Ok(MODEL_KEYS
        .iter()
        .filter_map(|key| {
            table
                .get(*key)
                .map(|value| (format!("{PREFIX}{key}"), value.to_string()))
        })
        .collect())
}

fn train_table(train: &TrainConfig) -> Result<toml::Table, ConfigError> {
    toml::Table::try_from(train).map_err(|e| ConfigError::Invalid(format!("train: {e}")))
}

/// The `[train]` values of `job`: its spec's keys (the validation cadence only with
/// validation) and its model keys.
fn job_values(job: &Job) -> Result<toml::Table, ConfigError> {
    let spec = JobSpec::of(job).map_err(|e| invalid(e.to_string()))?;
    let of_spec = train_table(&TrainConfig::default().with_spec(&spec))?;
    let mut values: toml::Table = SPEC_KEYS
        .iter()
        .filter(|key| spec.validation.is_some() || !matches!(**key, "val_every" | "val_samples"))
        .filter_map(|key| Some((key.to_string(), of_spec.get(*key)?.clone())))
        .collect();
    for key in MODEL_KEYS {
        let Some(text) = job.settings.get(&format!("{PREFIX}{key}")) else {
            continue;
        };
        let value = format!("v = {text}")
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .ok_or_else(|| invalid(format!("{PREFIX}{key} {text:?} is not a TOML value")))?;
        values.insert(key.to_string(), value);
    }
    Ok(values)
}

/// `config` with the job's `[train]` values for every job key its file does not set.
pub fn adopted(config: &NodeConfig, job: &Job) -> Result<NodeConfig, ConfigError> {
    if !job.settings.keys().any(|name| name.starts_with(PREFIX)) {
        return Err(invalid(
            "it was defined by a program of its own, not by parcae-node's [train], so there is \
             nothing to adopt: give this node the job's settings"
                .into(),
        ));
    }
    let values = job_values(job)?;
    let mut table = train_table(&config.train)?;
    for key in MODEL_KEYS.iter().chain(&SPEC_KEYS) {
        if config.explicit_train.contains(*key) {
            continue;
        }
        table.remove(*key);
        if let Some(value) = values.get(*key) {
            table.insert(key.to_string(), value.clone());
        }
    }
    let train: TrainConfig = toml::Value::Table(table)
        .try_into()
        .map_err(|e| invalid(format!("its [train] settings: {e}")))?;
    let adopted = NodeConfig {
        train,
        ..config.clone()
    };
    adopted.validate()?;
    Ok(adopted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::JobSource;
    use crate::job::Identity;

    fn job_of(config: &NodeConfig) -> Job {
        let program = recipe(config).unwrap();
        config
            .train
            .job_spec()
            .job(&Identity::default(), &program)
            .unwrap()
    }

    #[test]
    fn a_joiner_takes_the_job_s_train_keys_and_keeps_the_ones_it_sets() {
        let founder = NodeConfig::parse(
            "[train]\nmodel = \"small\"\nd_model = 64\nseed = 9\nglobal_batch = 32\n\
             peak_lr = 0.003\nval_fraction = 0.1\nval_every = 7",
            "founder",
        )
        .unwrap();
        let job = job_of(&founder);
        let spec = JobSpec::of(&job).unwrap();
        assert_eq!(spec.seed, 9);
        assert_eq!(job.settings["train.model"], "\"small\"");
        assert_eq!(job.settings["train.d_model"], "64");
        assert_eq!(spec.validation.map(|v| v.every), Some(7));
        let joiner = NodeConfig::parse(
            "[train]\njob = \"adopt\"\ndata_port = 7100\npeer_timeout_secs = 3.0",
            "joiner",
        )
        .unwrap();
        let taken = adopted(&joiner, &job).unwrap();
        assert_eq!(taken.train.job, JobSource::Adopt);
        assert_eq!(taken.model(), founder.model());
        assert_eq!(recipe(&taken).unwrap(), recipe(&founder).unwrap());
        assert_eq!(taken.train.job_spec(), founder.train.job_spec());
        assert_eq!(taken.train.data_port, 7100, "the node's own keys stay");
        assert_eq!(taken.train.peer_timeout_secs, 3.0);
        let explicit = NodeConfig::parse("[train]\njob = \"adopt\"\nseed = 4", "explicit").unwrap();
        let kept = adopted(&explicit, &job).unwrap();
        assert_eq!(kept.train.seed, 4, "a key the file sets is not overridden");
        assert_eq!(kept.train.global_batch, 32);
    }

    #[test]
    fn the_same_model_spelled_two_ways_has_one_recipe_and_validation_cadence_counts_only_with_validation()
     {
        let preset = NodeConfig::parse("[train]\nmodel = \"tiny\"", "a").unwrap();
        let spelled = NodeConfig::parse(
            &format!(
                "[train]\nd_model = {}\nval_every = 3",
                preset.model().d_model
            ),
            "b",
        )
        .unwrap();
        assert_eq!(recipe(&preset).unwrap(), recipe(&spelled).unwrap());
        assert_eq!(preset.train.job_spec(), spelled.train.job_spec());
    }

    #[test]
    fn a_job_without_train_settings_or_with_bad_values_is_not_adopted() {
        let joiner = NodeConfig::parse("[train]\njob = \"adopt\"", "j").unwrap();
        let mut job = Job::default();
        job.settings.insert("seed".into(), "3".into());
        let e = adopted(&joiner, &job).unwrap_err().to_string();
        assert!(e.contains("nothing to adopt"), "{e}");
        let mut job = job_of(&NodeConfig::default());
        job.settings.insert("seed".into(), "three".into());
        let e = adopted(&joiner, &job).unwrap_err().to_string();
        assert!(e.contains("seed"), "{e}");
        job.settings.insert("seed".into(), "3".into());
        job.settings.insert("train.d_model".into(), "3 4".into());
        let e = adopted(&joiner, &job).unwrap_err().to_string();
        assert!(e.contains("is not a TOML value"), "{e}");
        job.settings.insert("train.d_model".into(), "32".into());
        job.settings.insert("batch.global".into(), "0".into());
        let e = adopted(&joiner, &job).unwrap_err().to_string();
        assert!(e.contains("global_batch"), "{e}");
    }
}
