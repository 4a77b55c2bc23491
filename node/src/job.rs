//! The job a cluster trains. [`JobSpec`] is the part every layer is told (seed, batch sizes,
//! step limit, checkpoint cadence, optimizer, validation split); [`JobSpec::job`] writes it,
//! with what the model and the data are ([`Identity`]), into the replicated
//! [`Job`] that the first `DefineJob` to commit fixes for the cluster, and [`JobSpec::of`] reads
//! it back. Nothing else writes or reads a job's settings, so a setting has one name: a node
//! whose own job differs is told which one (`Job::difference`), and a joiner that adopts the
//! job reads the same names it was written under.

use std::collections::BTreeMap;

use parcae_consensus::state::Job;
use parcae_model::{Dataset, ModelError, OptimizerConfig, PipelineModel, WeightSource};
use parcae_outer::{OuterSettings, SyncMode};
use serde::{Deserialize, Serialize};

/// Seed, batch sizes, step limit, checkpoint cadence, optimizer and validation split: what
/// every node must be told the same for their steps to be one training run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Seed of the weights and of the data order.
    pub seed: u64,
    /// Samples per step over the cluster.
    pub global_batch: u32,
    /// Samples per micro-batch.
    pub micro_batch: u32,
    /// Stop after this many committed steps (0: never).
    pub max_steps: u64,
    /// Checkpoint every this many steps (0: never).
    pub checkpoint_every: u64,
    /// AdamW, schedule and clipping.
    pub optimizer: OptimizerConfig,
    /// The held-out split and how often its loss is measured, if any.
    pub validation: Option<ValidationConfig>,
    /// How replicas in different zones agree (every step, or DiLoCo rounds).
    pub sync: SyncMode,
    /// DiLoCo's outer optimizer (used under `diloco` only).
    pub outer: OuterSettings,
}

impl Default for JobSpec {
    /// Seed 1, batches of 16 in micro-batches of 2, no step limit, a checkpoint every 20
    /// steps, AdamW's defaults, no validation.
    fn default() -> Self {
        Self {
            seed: 1,
            global_batch: 16,
            micro_batch: 2,
            max_steps: 0,
            checkpoint_every: 20,
            optimizer: OptimizerConfig::default(),
            validation: None,
            sync: SyncMode::Step,
            outer: OuterSettings::default(),
        }
    }
}

/// A validation split: the last `fraction` of the dataset's examples, never trained; every
/// `every` steps pipeline 0 evaluates its first `samples` (the same ones each time) after the
/// step's training micro-batches, and the step's record carries their mean loss.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ValidationConfig {
    /// Share of the examples held out, in (0, 1).
    pub fraction: f64,
    /// Steps between evaluations (step 0 evaluates too).
    pub every: u64,
    /// Samples evaluated each time.
    pub samples: u32,
}

/// What the model and the data of a job are, as far as nodes must agree on them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Identity {
    /// The model's architecture ([`PipelineModel::architecture`]).
    pub architecture: String,
    /// Its pipeline layers.
    pub layers: usize,
    /// Where its weights start: `seeded`, or the identity of the starting weights.
    pub init: String,
    /// SHA-256 of the data (hex).
    pub data_sha256: String,
    /// Examples in the data.
    pub examples: u64,
    /// Tokens per example.
    pub seq_len: usize,
    /// The data's vocabulary.
    pub vocab_size: usize,
}

impl Identity {
    /// Reads the dataset (and starting weights) once to hash them; a dataset with token ids the
    /// model does not take is refused.
    pub fn of<M: PipelineModel>(
        model: &M,
        dataset: &dyn Dataset,
        initial_weights: Option<&dyn WeightSource>,
    ) -> Result<Identity, ModelError> {
        parcae_model::check_vocabulary(model, dataset)?;
        Ok(Identity {
            architecture: model.architecture(),
            layers: model.num_layers(),
            init: match initial_weights {
                Some(w) => w.identity()?,
                None => "seeded".into(),
            },
            data_sha256: hex::encode(dataset.fingerprint()?),
            examples: dataset.len(),
            seq_len: dataset.seq_len(),
            vocab_size: dataset.vocab_size(),
        })
    }
}

/// A job whose settings cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// A program setting is named like one of the job's own.
    #[error("the job setting {0} is defined twice")]
    Twice(String),
    /// A setting is missing or does not hold a value of its kind.
    #[error("the job's setting {name}: {reason}")]
    Setting {
        /// The setting.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// The names of a job's own settings (a program's settings take other names).
mod names {
    pub const ARCHITECTURE: &str = "model.architecture";
    pub const LAYERS: &str = "model.layers";
    pub const INIT: &str = "model.init";
    pub const DATA_SHA256: &str = "data.sha256";
    pub const EXAMPLES: &str = "data.examples";
    pub const SEQ_LEN: &str = "data.seq_len";
    pub const VOCAB_SIZE: &str = "data.vocab_size";
    pub const VALIDATION: &str = "data.validation";
    pub const SEED: &str = "seed";
    pub const GLOBAL_BATCH: &str = "batch.global";
    pub const MICRO_BATCH: &str = "batch.micro";
    pub const OPTIMIZER: &str = "optimizer";
    pub const MAX_STEPS: &str = "max_steps";
    pub const CHECKPOINT_EVERY: &str = "checkpoint_every";
    pub const SYNC: &str = "sync";
    pub const OUTER: &str = "sync.outer";
}

/// A structured value as a setting (JSON).
fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

impl JobSpec {
    /// The replicated job: this spec, what the model and the data are, and the settings of
    /// the program that defines it (`program`, compared like the others; `parcae-node` puts
    /// its model's `[train]` keys there so that a joiner can adopt the job).
    pub fn job(&self, what: &Identity, program: &[(String, String)]) -> Result<Job, JobError> {
        use names::*;
        let settings = [
            (ARCHITECTURE, what.architecture.clone()),
            (LAYERS, what.layers.to_string()),
            (INIT, what.init.clone()),
            (DATA_SHA256, what.data_sha256.clone()),
            (EXAMPLES, what.examples.to_string()),
            (SEQ_LEN, what.seq_len.to_string()),
            (VOCAB_SIZE, what.vocab_size.to_string()),
            (VALIDATION, json(&self.validation)),
            (SEED, self.seed.to_string()),
            (GLOBAL_BATCH, self.global_batch.to_string()),
            (MICRO_BATCH, self.micro_batch.to_string()),
            (OPTIMIZER, json(&self.optimizer)),
            (MAX_STEPS, self.max_steps.to_string()),
            (CHECKPOINT_EVERY, self.checkpoint_every.to_string()),
            (SYNC, self.sync.to_string()),
            (OUTER, json(&self.outer)),
        ];
        let mut job = Job {
            settings: settings
                .into_iter()
                .map(|(name, value)| (name.to_string(), value))
                .collect(),
        };
        for (name, value) in program {
            if job.settings.insert(name.clone(), value.clone()).is_some() {
                return Err(JobError::Twice(name.clone()));
            }
        }
        Ok(job)
    }

    /// How a replicated job synchronises its replicas.
    pub fn sync_of(job: &Job) -> Result<SyncMode, JobError> {
        // A job written before DiLoCo existed synchronised every step.
        match job.settings.contains_key(names::SYNC) {
            true => setting(&job.settings, names::SYNC),
            false => Ok(SyncMode::Step),
        }
    }

    /// The spec a replicated job was written with.
    pub fn of(job: &Job) -> Result<JobSpec, JobError> {
        use names::*;
        let s = &job.settings;
        Ok(JobSpec {
            seed: setting(s, SEED)?,
            global_batch: setting(s, GLOBAL_BATCH)?,
            micro_batch: setting(s, MICRO_BATCH)?,
            max_steps: setting(s, MAX_STEPS)?,
            checkpoint_every: setting(s, CHECKPOINT_EVERY)?,
            optimizer: json_setting(s, OPTIMIZER)?,
            validation: json_setting(s, VALIDATION)?,
            sync: Self::sync_of(job)?,
            outer: match s.contains_key(OUTER) {
                true => json_setting(s, OUTER)?,
                false => OuterSettings::default(),
            },
        })
    }
}

/// The setting `name`, as a number.
fn setting<T: std::str::FromStr>(
    settings: &BTreeMap<String, String>,
    name: &'static str,
) -> Result<T, JobError>
where
    T::Err: std::fmt::Display,
{
    let text = present(settings, name)?;
    text.parse().map_err(|e| JobError::Setting {
        name,
        reason: format!("{text:?}: {e}"),
    })
}

/// The setting `name`, as a JSON value.
fn json_setting<T: serde::de::DeserializeOwned>(
    settings: &BTreeMap<String, String>,
    name: &'static str,
) -> Result<T, JobError> {
    let text = present(settings, name)?;
    serde_json::from_str(text).map_err(|e| JobError::Setting {
        name,
        reason: format!("{text:?}: {e}"),
    })
}

fn present<'a>(
    settings: &'a BTreeMap<String, String>,
    name: &'static str,
) -> Result<&'a String, JobError> {
    settings.get(name).ok_or_else(|| JobError::Setting {
        name,
        reason: "missing".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use parcae_model::{Gpt, GptConfig, SyntheticTask};

    fn job(seed: u64, task_seed: u64) -> Job {
        let model = Gpt::new(GptConfig::tiny()).unwrap();
        let task = SyntheticTask::default_for(task_seed, 64, 16).unwrap();
        let spec = JobSpec {
            seed,
            ..JobSpec::default()
        };
        spec.job(&Identity::of(&model, &task, None).unwrap(), &[])
            .unwrap()
    }

    #[test]
    fn jobs_differ_in_the_setting_that_differs() {
        assert_eq!(job(1, 1), job(1, 1));
        assert_eq!(
            job(1, 1).difference(&job(2, 1)).unwrap(),
            "seed: the cluster's job has \"1\", this node's \"2\""
        );
        assert!(
            job(1, 1)
                .difference(&job(1, 2))
                .unwrap()
                .starts_with("data.sha256:")
        );
    }

    #[test]
    fn the_spec_is_read_back_as_written_and_a_bad_setting_is_named() {
        let spec = JobSpec {
            seed: 9,
            global_batch: 64,
            micro_batch: 4,
            max_steps: 100,
            checkpoint_every: 7,
            optimizer: OptimizerConfig {
                peak_lr: 3e-3,
                ..OptimizerConfig::default()
            },
            validation: Some(ValidationConfig {
                fraction: 0.1,
                every: 5,
                samples: 8,
            }),
            sync: SyncMode::Diloco(20),
            outer: OuterSettings {
                lr: 1.0,
                momentum: 0.0,
                ..OuterSettings::default()
            },
        };
        let program = [("train.model".to_string(), "\"small\"".to_string())];
        let mut job = spec.job(&Identity::default(), &program).unwrap();
        assert_eq!(JobSpec::of(&job).unwrap(), spec);
        assert_eq!(job.settings["train.model"], "\"small\"");
        let twice = [("seed".to_string(), "3".to_string())];
        let e = spec.job(&Identity::default(), &twice).unwrap_err();
        assert_eq!(e.to_string(), "the job setting seed is defined twice");
        job.settings.insert("batch.micro".into(), "four".into());
        let e = JobSpec::of(&job).unwrap_err().to_string();
        assert!(e.contains("batch.micro") && e.contains("four"), "{e}");
        job.settings.insert("batch.micro".into(), "4".into());
        job.settings.remove("optimizer");
        let e = JobSpec::of(&job).unwrap_err().to_string();
        assert_eq!(e, "the job's setting optimizer: missing");
    }
}
