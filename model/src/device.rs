//! Backend choice at run time.
//!
//! Burn 0.22 modules are not generic over the backend: the backend is a property of the
//! [`Device`]. Flex is the CPU default (measured 1.3x faster than NdArray on the `small` preset,
//! and 7x faster at reading tensors back, which every pipeline boundary does).

use burn::tensor::Device;

use crate::error::{ModelError, Result};

/// The backends this build can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Burn's Flex CPU backend.
    Flex,
    /// CUDA device `index` (requires the `cuda` feature).
    Cuda(usize),
    /// Burn's Cube backend on this CPU: wgpu's Vulkan on Mesa's lavapipe (requires the
    /// `cube-cpu` feature). Slow; it runs the code a GPU runs, where no GPU is.
    CubeCpu,
}

impl std::str::FromStr for Backend {
    type Err = ModelError;

    /// Parses `flex`, `cpu`, `cube-cpu` or `cuda[:index]`.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "flex" | "cpu" => Ok(Self::Flex),
            "cube-cpu" => Ok(Self::CubeCpu),
            "cuda" => Ok(Self::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|i| i.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| ModelError::InvalidConfig(format!("unknown backend {other:?}"))),
        }
    }
}

impl Backend {
    /// The autodiff device for training on this backend.
    pub fn device(self) -> Result<Device> {
        self.base_device().map(Device::autodiff)
    }

    /// This backend's device without autodiff, made as [`Self::device`] makes it (checked
    /// usable, a Cube runtime on one stream): what a test wraps with autodiff its own ways.
    pub fn base_device(self) -> Result<Device> {
        match self {
            Self::Flex => Ok(Device::flex()),
            #[cfg(feature = "cuda")]
            Self::Cuda(i) => usable(&format!("CUDA GPU {i}"), move || Device::cuda(i)),
            #[cfg(not(feature = "cuda"))]
            Self::Cuda(_) => Err(ModelError::InvalidConfig(
                "this build has no CUDA backend (enable the `cuda` feature)".into(),
            )),
            #[cfg(feature = "cube-cpu")]
            Self::CubeCpu => usable("the Cube CPU runtime (wgpu on lavapipe)", || {
                Device::wgpu(burn::tensor::DeviceKind::Cpu)
            }),
            #[cfg(not(feature = "cube-cpu"))]
            Self::CubeCpu => Err(ModelError::InvalidConfig(
                "this build has no Cube CPU runtime (enable the `cube-cpu` feature)".into(),
            )),
        }
    }
}

/// The cubecl device `make` gives, checked by one allocation read back: cubecl
/// starts the runtime on a runner thread at a device's first use and panics there where it
/// cannot (no driver library, no such device, a PTX the driver refuses), which the reading
/// thread only sees as a lost tensor. The first panic of the probe, on any thread, is kept (and
/// not printed) to name the cause in one error naming `what`, before any training starts.
#[cfg(any(feature = "cuda", feature = "cube-cpu"))]
fn usable(what: &str, make: impl FnOnce() -> Device + std::panic::UnwindSafe) -> Result<Device> {
    use std::sync::Mutex;
    static FIRST_PANIC: Mutex<Option<String>> = Mutex::new(None);
    fn text(payload: &(dyn std::any::Any + Send)) -> String {
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "the runtime panicked".into())
    }
    // One stream for all of the process's device work: cubecl's default gives each OS thread a
    // stream (and a memory pool), and a stage's work crosses threads (the lanes' pools, the
    // node's loops), each crossing a synchronisation and each stream's pool another copy of
    // the stage's memory.
    cubecl_environment::stream::set_policy(cubecl_environment::stream::StreamPolicy::Single);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        let mut first = FIRST_PANIC.lock().unwrap_or_else(|e| e.into_inner());
        first.get_or_insert_with(|| text(info.payload()));
    }));
    let probe = std::panic::catch_unwind(move || {
        let device = make();
        burn::tensor::Tensor::<1>::zeros([1], &device)
            .try_into_data()
            .map(|_| device)
    });
    std::panic::set_hook(previous);
    let first = FIRST_PANIC.lock().unwrap_or_else(|e| e.into_inner()).take();
    let why = match probe {
        Ok(Ok(device)) => return Ok(device),
        Ok(Err(e)) => first.unwrap_or_else(|| format!("{e:?}")),
        Err(payload) => first.unwrap_or_else(|| text(payload.as_ref())),
    };
    Err(ModelError::InvalidConfig(format!(
        "{what} cannot be used: {why}"
    )))
}

/// The default training device: Flex with autodiff.
pub fn default_device() -> Device {
    Device::flex().autodiff()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_backends() {
        assert_eq!("flex".parse::<Backend>().unwrap(), Backend::Flex);
        assert_eq!("cuda:1".parse::<Backend>().unwrap(), Backend::Cuda(1));
        assert_eq!("cube-cpu".parse::<Backend>().unwrap(), Backend::CubeCpu);
        assert!("tpu".parse::<Backend>().is_err());
        assert!(Backend::Flex.device().unwrap().is_autodiff());
    }
}
