//! How `GradSync` names a parameter ([`ParamRef`]) and reaches a
//! framework's parameter values ([`ParamAccess`]).

use super::GradSync;
use crate::error::{OptimError, Result};
use gradwire_comm::Communicator;

/// A parameter named by its declared name or its declaration index.
pub trait ParamRef {
    /// Its declaration index in `sync`, if any.
    fn index_in<C: Communicator + 'static>(&self, sync: &GradSync<C>) -> Option<usize>;
}

impl ParamRef for &str {
    fn index_in<C: Communicator + 'static>(&self, sync: &GradSync<C>) -> Option<usize> {
        sync.specs.iter().position(|s| s.name == *self)
    }
}

impl ParamRef for usize {
    fn index_in<C: Communicator + 'static>(&self, sync: &GradSync<C>) -> Option<usize> {
        (*self < sync.specs.len()).then_some(*self)
    }
}

/// Where a framework keeps its parameters, for
/// [`GradSync::step_locally`]: parameter `index` (declaration order) read
/// into and written from f32 values of its declared length.
pub trait ParamAccess {
    /// Copies parameter `index`'s values into `out`.
    fn read(&self, index: usize, out: &mut [f32]) -> Result<()>;
    /// Sets parameter `index`'s values to `values`.
    fn write(&mut self, index: usize, values: &[f32]) -> Result<()>;
}

/// Parameters as the caller's own f32 slices, in declaration order.
impl ParamAccess for [&mut [f32]] {
    fn read(&self, index: usize, out: &mut [f32]) -> Result<()> {
        match self.get(index) {
            Some(p) if p.len() == out.len() => {
                out.copy_from_slice(p);
                Ok(())
            }
            p => Err(OptimError::InvalidArgument(format!(
                "parameter {index}: {} values given, {} declared",
                p.map_or(0, |p| p.len()),
                out.len()
            ))),
        }
    }

    fn write(&mut self, index: usize, values: &[f32]) -> Result<()> {
        match self.get_mut(index) {
            Some(p) if p.len() == values.len() => {
                p.copy_from_slice(values);
                Ok(())
            }
            _ => Err(OptimError::InvalidArgument(format!(
                "parameter {index}: no buffer of {} values",
                values.len()
            ))),
        }
    }
}
