//! A parameter's declaration ([`ParamSpec`]) and the checks of gradients
//! and parameters against it, done before anything is sent.

use crate::error::{OptimError, Result};
use gradwire_tensor::{DType, Device, Tensor};

/// A parameter's declaration: its name, shape, dtype and device.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// The name the optimizer knows it by.
    pub name: String,
    /// Its shape; gradients must have it.
    pub shape: Vec<usize>,
    /// Its gradients' dtype (default f32): every rank packs the same
    /// buffers, and a gradient no rank pushed is a zero of this dtype.
    pub dtype: DType,
    /// Where its gradients live (default the CPU).
    pub device: Device,
}

impl ParamSpec {
    /// A declaration of an f32 parameter on the CPU.
    pub fn new(name: impl Into<String>, shape: impl Into<Vec<usize>>) -> Self {
        ParamSpec {
            name: name.into(),
            shape: shape.into(),
            dtype: DType::F32,
            device: Device::Cpu,
        }
    }

    /// The same declaration with gradients of `dtype`.
    pub fn with_dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    /// The same declaration with gradients on `device`.
    pub fn on_device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// The element count, checked: a shape whose product overflows is an
    /// error, not a wrapped size.
    pub(super) fn checked_len(&self) -> Result<usize> {
        self.shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| {
                OptimError::InvalidArgument(format!(
                    "parameter {}: shape {:?} has more elements than fit in memory",
                    self.name, self.shape
                ))
            })
    }

    /// Whether `t` matches this declaration (shape, dtype, device); the
    /// error names what differs.
    pub(super) fn check(&self, what: &str, t: &Tensor) -> Result<()> {
        if t.dims() != self.shape.as_slice() {
            return Err(OptimError::ShapeMismatch {
                what: format!("{what} of {}", self.name),
                expected: self.shape.clone(),
                got: t.dims().to_vec(),
            });
        }
        if t.dtype() != self.dtype {
            return Err(OptimError::InvalidArgument(format!(
                "{what} of {}: dtype {} declared, got {}",
                self.name,
                self.dtype,
                t.dtype()
            )));
        }
        if t.device() != self.device {
            return Err(OptimError::InvalidArgument(format!(
                "{what} of {}: device {:?} declared, got {:?}",
                self.name,
                self.device,
                t.device()
            )));
        }
        Ok(())
    }
}

impl ParamSpec {
    /// Whether a parameter tensor matches this declaration: its shape and
    /// device (its dtype may differ from the gradients': updates run in
    /// f32).
    pub(super) fn check_param(&self, t: &Tensor) -> Result<()> {
        if t.dims() != self.shape.as_slice() {
            return Err(OptimError::ShapeMismatch {
                what: format!("parameter {}", self.name),
                expected: self.shape.clone(),
                got: t.dims().to_vec(),
            });
        }
        if t.device() != self.device {
            return Err(OptimError::InvalidArgument(format!(
                "parameter {}: device {:?} declared, got {:?}",
                self.name,
                self.device,
                t.device()
            )));
        }
        Ok(())
    }
}
