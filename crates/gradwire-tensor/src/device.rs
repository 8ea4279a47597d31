//! [`Device`]: where a tensor's memory lives.
//!
//! Kept as a small `Copy` enum so that operations can check that all their
//! operands live on the same device before touching memory, and so that error
//! values can say which devices were involved.

use std::fmt;

/// A memory location for tensor data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Device {
    /// Host memory.
    #[default]
    Cpu,
    /// The CUDA device with this ordinal.
    Cuda(usize),
}

impl Device {
    /// Whether this is host memory.
    pub const fn is_cpu(self) -> bool {
        matches!(self, Device::Cpu)
    }

    /// Whether this is a CUDA device.
    pub const fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

impl fmt::Display for Device {
    /// `cpu` or `cuda:N`, the spelling used by configs and PyTorch.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display() {
        assert_eq!(Device::Cpu.to_string(), "cpu");
        assert_eq!(Device::Cuda(3).to_string(), "cuda:3");
        assert!(Device::Cpu.is_cpu() && !Device::Cuda(0).is_cpu());
    }
}
