//! The `[placement]` section: where the node runs, as it tells the cluster when it joins.

use parcae_consensus::state::Capabilities;
use serde::Deserialize;

use super::device::DeviceConfig;
use super::error::ConfigError;

/// The `[placement]` section (`--zone`, `--instance-type`); empty where unknown.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(default, deny_unknown_fields)]
pub struct PlacementConfig {
    /// The cloud zone, e.g. `us-east-1a`.
    pub zone: String,
    /// The instance type, e.g. `p3.2xlarge`.
    pub instance_type: String,
}

impl PlacementConfig {
    /// What a node here, training on `device`, says of itself in its membership record.
    pub fn capabilities(&self, device: &DeviceConfig) -> Capabilities {
        Capabilities {
            zone: self.zone.clone(),
            instance_type: self.instance_type.clone(),
            device: device.name(),
            memory_mib: device.memory_mib(),
        }
    }

    /// Refuses a zone or instance type the membership would refuse, named by its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.capabilities(&DeviceConfig::default())
            .check()
            .map_err(|(field, why)| {
                let key = field.replace("caps.", "placement.");
                ConfigError::Invalid(format!("{key}: {why}"))
            })
    }
}
