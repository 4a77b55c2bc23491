//! `--device`: what the testnet's nodes train on, and which CUDA GPU each node takes.

use std::process::{Command, Stdio};

/// The device every node of a run trains on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Devices {
    /// Burn's CPU backend (or the emulated accelerator with `--emulate`).
    #[default]
    Cpu,
    /// Burn's Cube backend on the CPU (nodes built with `cube-cpu`).
    CubeCpu,
    /// CUDA GPUs: node k on `indices[k % indices.len()]`.
    Cuda(Vec<usize>),
}

/// `--device`'s value as written: `cpu`, `cube-cpu`, `cuda` (every visible GPU, round robin) or
/// `cuda:N` (every node on GPU N).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceArg {
    /// The CPU.
    Cpu,
    /// The Cube CPU runtime.
    CubeCpu,
    /// Every visible GPU.
    CudaVisible,
    /// One GPU.
    Cuda(usize),
}

impl std::str::FromStr for DeviceArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "cpu" => Ok(Self::Cpu),
            "cube-cpu" => Ok(Self::CubeCpu),
            "cuda" => Ok(Self::CudaVisible),
            other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(index)) => Ok(Self::Cuda(index)),
                _ => Err(format!(
                    "unknown device {other:?} (expected cpu, cube-cpu, cuda or cuda:N with N a \
                     GPU index)"
                )),
            },
        }
    }
}

impl DeviceArg {
    /// The nodes' devices; `visible` counts the GPUs for `cuda` ([`visible`] on a real run).
    pub fn devices(self, visible: impl FnOnce() -> usize) -> Devices {
        match self {
            Self::Cpu => Devices::Cpu,
            Self::CubeCpu => Devices::CubeCpu,
            Self::CudaVisible => Devices::Cuda((0..visible().max(1)).collect()),
            Self::Cuda(index) => Devices::Cuda(vec![index]),
        }
    }
}

impl Devices {
    /// The device one process replays the cluster's training on: the nodes' device, the first
    /// GPU of several.
    pub fn replay_device(&self) -> String {
        match self {
            Self::Cpu => "cpu".to_string(),
            Self::CubeCpu => "cube-cpu".to_string(),
            Self::Cuda(indices) => format!("cuda:{}", indices.first().copied().unwrap_or(0)),
        }
    }

    /// The `[device]` section of node `k`'s configuration (none on the CPU, the default).
    pub fn section(&self, k: usize) -> Option<String> {
        match self {
            Self::Cpu => None,
            Self::CubeCpu => Some("[device]\nkind = \"cube-cpu\"\n".into()),
            Self::Cuda(indices) => {
                let index = indices.get(k % indices.len().max(1)).copied().unwrap_or(0);
                Some(format!("[device]\nkind = \"cuda\"\nindex = {index}\n"))
            }
        }
    }
}

/// How many GPUs the CUDA driver shows this process: the entries of `CUDA_VISIBLE_DEVICES`
/// where it is set, else the lines of `nvidia-smi -L`, else one (the nodes then share GPU 0,
/// and a node without a GPU says so itself).
pub fn visible() -> usize {
    if let Ok(list) = std::env::var("CUDA_VISIBLE_DEVICES") {
        return count_listed(&list);
    }
    Command::new("nvidia-smi")
        .arg("-L")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| count_gpu_lines(&String::from_utf8_lossy(&out.stdout)))
        .filter(|n| *n > 0)
        .unwrap_or(1)
}

/// Entries of a `CUDA_VISIBLE_DEVICES` list (`0,1`, `GPU-uuid,...`); an empty list hides
/// every GPU, which still leaves the nodes one index to fail on with their own message.
fn count_listed(list: &str) -> usize {
    list.split(',')
        .filter(|e| !e.trim().is_empty())
        .count()
        .max(1)
}

/// `nvidia-smi -L` prints one `GPU i: NAME (UUID: ...)` line per GPU (and MIG lines below).
fn count_gpu_lines(text: &str) -> usize {
    text.lines().filter(|l| l.starts_with("GPU ")).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_spreads_the_nodes_over_the_visible_gpus_and_cuda_n_puts_them_on_one() {
        let arg = |s: &str| s.parse::<DeviceArg>().unwrap();
        let index = |d: &Devices, k: usize| {
            let section = d.section(k)?;
            let line = section.lines().find(|l| l.starts_with("index = "))?;
            line["index = ".len()..].parse::<usize>().ok()
        };
        assert_eq!(arg("cpu").devices(|| 4), Devices::Cpu);
        assert_eq!(Devices::Cpu.section(3), None);
        let spread = arg("cuda").devices(|| 3);
        let gpus: Vec<_> = (0..7).map(|k| index(&spread, k).unwrap()).collect();
        assert_eq!(gpus, [0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(spread.replay_device(), "cuda:0");
        let one = arg("cuda:2").devices(|| 3);
        assert!((0..5).all(|k| index(&one, k) == Some(2)));
        assert_eq!(arg("cuda").devices(|| 0), Devices::Cuda(vec![0]));
        let cube = arg("cube-cpu").devices(|| 3);
        assert_eq!(cube.section(4).unwrap(), "[device]\nkind = \"cube-cpu\"\n");
        assert_eq!(cube.replay_device(), "cube-cpu");
        for bad in ["gpu", "cuda:", "cuda:a", "cuda:-1"] {
            let e = bad.parse::<DeviceArg>().unwrap_err();
            assert!(e.contains("cpu, cube-cpu, cuda or cuda:N"), "{e}");
        }
    }

    #[test]
    fn visible_gpus_are_counted_from_the_list_or_the_driver() {
        assert_eq!(count_listed("0,1,3"), 3);
        assert_eq!(count_listed("GPU-5e6b,GPU-77aa"), 2);
        assert_eq!(count_listed(""), 1);
        let smi = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n  MIG 1g.10gb Device 0: (UUID: MIG-1)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)\n";
        assert_eq!(count_gpu_lines(smi), 2);
    }
}
