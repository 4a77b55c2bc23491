//! A joiner's `[train]` from the cluster's job (`[train] job = "adopt"`).
//!
//! `parcae-node` puts its resolved `[train]` job settings into the job it defines, as
//! `train.<key>` settings holding TOML values ([`recipe`]). A node that adopts the job waits for
//! it, then trains with those values, except for the keys its own file sets ([`adopted`]): those
//! stay, and where they differ from the job the node is refused like any other whose job
//! differs. What is the node's own (its data file, the token width, starting weights, store,
//! timeouts, port) never comes from the job; the data file is still checked against the job's
//! hash.

use parcae_consensus::state::Job;

use crate::config::{ConfigError, NodeConfig, TrainConfig};

/// The `[train]` keys that make up the job (besides the data file's identity, which the job
/// holds as a hash).
pub const JOB_KEYS: [&str; 17] = [
    "model",
    "vocab_size",
    "d_model",
    "n_heads",
    "n_blocks",
    "d_ff",
    "seq_len",
    "val_fraction",
    "val_every",
    "val_samples",
    "seed",
    "global_batch",
    "micro_batch",
    "max_steps",
    "checkpoint_every",
    "peak_lr",
    "warmup_steps",
];

/// Prefix of the job settings that carry `[train]` keys.
const PREFIX: &str = "train.";

fn invalid(reason: String) -> ConfigError {
    ConfigError::Invalid(format!("the cluster's job: {reason}"))
}

/// The job settings of `config`'s `[train]`: every job key as a TOML value, the model's sizes
/// resolved (so two files that spell the same model differently agree), the validation cadence
/// only where there is validation.
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
    let table =
        toml::Table::try_from(&train).map_err(|e| ConfigError::Invalid(format!("train: {e}")))?;
    let validation = train.val_fraction > 0.0;
    Ok(JOB_KEYS
        .iter()
        .filter(|key| validation || !matches!(**key, "val_every" | "val_samples"))
        .filter_map(|key| {
            table
                .get(*key)
                .map(|value| (format!("{PREFIX}{key}"), value.to_string()))
        })
        .collect())
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
    let mut table = toml::Table::try_from(&config.train)
        .map_err(|e| ConfigError::Invalid(format!("train: {e}")))?;
    for key in JOB_KEYS {
        if config.explicit_train.contains(key) {
            continue;
        }
        table.remove(key);
        let Some(text) = job.settings.get(&format!("{PREFIX}{key}")) else {
            continue;
        };
        let value = format!("v = {text}")
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .ok_or_else(|| invalid(format!("{PREFIX}{key} {text:?} is not a TOML value")))?;
        table.insert(key.to_string(), value);
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

    fn job_of(config: &NodeConfig) -> Job {
        let mut job = Job::default();
        job.settings
            .insert("seed".into(), config.train.seed.to_string());
        job.settings.extend(recipe(config).unwrap());
        job
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
        assert_eq!(job.settings["train.seed"], "9");
        assert_eq!(job.settings["train.model"], "\"small\"");
        assert_eq!(job.settings["train.d_model"], "64");
        assert_eq!(job.settings["train.val_every"], "7");
        let joiner = NodeConfig::parse(
            "[train]\njob = \"adopt\"\ndata_port = 7100\npeer_timeout_secs = 3.0",
            "joiner",
        )
        .unwrap();
        let taken = adopted(&joiner, &job).unwrap();
        assert_eq!(taken.train.job, JobSource::Adopt);
        assert_eq!(taken.model(), founder.model());
        assert_eq!(recipe(&taken).unwrap(), recipe(&founder).unwrap());
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
    }

    #[test]
    fn a_job_without_train_settings_or_with_bad_values_is_not_adopted() {
        let joiner = NodeConfig::parse("[train]\njob = \"adopt\"", "j").unwrap();
        let mut job = Job::default();
        job.settings.insert("seed".into(), "3".into());
        let e = adopted(&joiner, &job).unwrap_err().to_string();
        assert!(e.contains("nothing to adopt"), "{e}");
        job.settings.insert("train.seed".into(), "\"three\"".into());
        let e = adopted(&joiner, &job).unwrap_err().to_string();
        assert!(e.contains("seed"), "{e}");
        job.settings.insert("train.seed".into(), "3 4".into());
        let e = adopted(&joiner, &job).unwrap_err().to_string();
        assert!(e.contains("is not a TOML value"), "{e}");
        job.settings.insert("train.seed".into(), "3".into());
        job.settings.insert("train.global_batch".into(), "0".into());
        let e = adopted(&joiner, &job).unwrap_err().to_string();
        assert!(e.contains("global_batch"), "{e}");
    }
}
