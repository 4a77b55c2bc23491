//! The job this node trains, as the named settings the cluster replicates
//! (`Command::DefineJob`): everything that must be equal on every node for their steps to be
//! one training run. The first definition that commits is the cluster's; a node whose own
//! differs is never given a slot and says which setting differs.

use parcae_consensus::state::Job;
use parcae_model::{Dataset, OptimizerConfig, PipelineModel, WeightSource};

use super::TrainError;
use super::launch::ValidationConfig;

/// What a job is made of, borrowed from the trainer's description.
pub struct JobParts<'a, M: PipelineModel> {
    /// The model.
    pub model: &'a M,
    /// All of the data (before any validation split).
    pub dataset: &'a dyn Dataset,
    /// Seed of the weights and the data order.
    pub seed: u64,
    /// Samples per step and per micro-batch.
    pub batch: (u32, u32),
    /// Step limit (0: none).
    pub max_steps: u64,
    /// Steps between checkpoints (0: never).
    pub checkpoint_every: u64,
    /// AdamW, schedule and clipping.
    pub optimizer: &'a OptimizerConfig,
    /// Where the weights start, if not from the seed.
    pub initial_weights: Option<&'a dyn WeightSource>,
    /// The held-out split, if any.
    pub validation: Option<ValidationConfig>,
    /// Further named settings (none of them named like a setting above).
    pub extra: &'a [(String, String)],
}

/// The job's settings. Reads the dataset (and starting weights) once to hash them.
pub fn job_of<M: PipelineModel>(parts: &JobParts<'_, M>) -> Result<Job, TrainError> {
    let d = parts.dataset;
    let validation = match parts.validation {
        Some(v) => format!(
            "the last {} of the examples; {} of them every {} steps",
            v.fraction, v.samples, v.every
        ),
        None => "none".into(),
    };
    let init = match parts.initial_weights {
        Some(w) => w.identity()?,
        None => "seeded".into(),
    };
    let settings = [
        ("model.architecture", parts.model.architecture()),
        ("model.layers", parts.model.num_layers().to_string()),
        ("model.init", init),
        ("data.sha256", hex::encode(d.fingerprint()?)),
        ("data.examples", d.len().to_string()),
        ("data.seq_len", d.seq_len().to_string()),
        ("data.vocab_size", d.vocab_size().to_string()),
        ("data.validation", validation),
        ("seed", parts.seed.to_string()),
        ("batch.global", parts.batch.0.to_string()),
        ("batch.micro", parts.batch.1.to_string()),
        ("optimizer", format!("{:?}", parts.optimizer)),
        ("max_steps", parts.max_steps.to_string()),
        ("checkpoint_every", parts.checkpoint_every.to_string()),
    ];
    let mut job = Job {
        settings: settings
            .into_iter()
            .map(|(name, value)| (name.to_string(), value))
            .collect(),
    };
    for (name, value) in parts.extra {
        if job.settings.insert(name.clone(), value.clone()).is_some() {
            return Err(TrainError::Config(format!(
                "the job setting {name} is defined twice"
            )));
        }
    }
    Ok(job)
}

#[cfg(test)]
mod tests {
    use super::*;
    use parcae_model::{Gpt, GptConfig, SyntheticTask};

    fn job(seed: u64, task_seed: u64) -> Job {
        let model = Gpt::new(GptConfig::tiny()).unwrap();
        let task = SyntheticTask::default_for(task_seed, 64, 16).unwrap();
        job_of(&JobParts {
            model: &model,
            dataset: &task,
            seed,
            batch: (16, 2),
            max_steps: 0,
            checkpoint_every: 20,
            optimizer: &OptimizerConfig::default(),
            initial_weights: None,
            validation: None,
            extra: &[],
        })
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
}
