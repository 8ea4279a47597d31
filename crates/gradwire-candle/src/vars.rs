//! Candle variables as gradwire sees them: their names and order, their
//! declarations, and their f32 values read and written in place (candle's
//! in-place custom ops give the storage for the length of one call, so no
//! copy of a parameter is kept on gradwire's side).

use crate::{Error, Result};
use candle_core::{CpuStorage, DType, InplaceOp1, InplaceOp2, Layout, Storage, Tensor, Var};
use candle_nn::VarMap;
use gradwire_optim::checkpoint::Checkpoint;
use gradwire_optim::{OptimError, ParamSpec};
use gradwire_tensor::Tensor as GwTensor;
use std::cell::RefCell;

/// The named variables of `varmap`, in the order every worker declares
/// them (sorted by name: a `VarMap` has no order of its own, and every
/// worker must declare the same parameters in the same order).
pub fn named_vars(varmap: &VarMap) -> Result<Vec<(String, Var)>> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| candle_core::Error::msg("the VarMap's lock is poisoned"))?;
    let mut vars: Vec<(String, Var)> = data.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(vars)
}

/// gradwire's declarations of `vars` (names and shapes; f32 on the CPU),
/// checked: a variable of another dtype or device is an error.
pub fn specs_of(vars: &[(String, Var)]) -> Result<Vec<ParamSpec>> {
    vars.iter()
        .map(|(name, var)| {
            check_f32_cpu(name, var.as_tensor())?;
            Ok(ParamSpec::new(name.clone(), var.dims().to_vec()))
        })
        .collect()
}

/// [`Error::Unsupported`] unless `t` is f32 in CPU memory (what this
/// version trains).
pub(crate) fn check_f32_cpu(name: &str, t: &Tensor) -> Result<()> {
    if t.dtype() != DType::F32 || !t.device().is_cpu() {
        return Err(Error::Unsupported {
            name: name.to_owned(),
            dtype: t.dtype(),
            device: format!("{:?}", t.device()),
        });
    }
    Ok(())
}

/// The f32 values of a contiguous CPU storage's `layout`, if it has them.
fn f32_range<'s>(storage: &'s CpuStorage, layout: &Layout) -> Option<&'s [f32]> {
    let (start, end) = layout.contiguous_offsets()?;
    match storage {
        CpuStorage::F32(values) => values.get(start..end),
        _ => None,
    }
}

/// The f32 values of `layout` in a contiguous CPU storage, mutably.
fn f32_range_mut<'s>(
    storage: &'s mut CpuStorage,
    layout: &Layout,
    op: &str,
) -> candle_core::Result<&'s mut [f32]> {
    let range = layout.contiguous_offsets();
    match (storage, range) {
        (CpuStorage::F32(values), Some((start, end))) if end <= values.len() => {
            Ok(&mut values[start..end])
        }
        _ => candle_core::bail!("{op}: the variable is not a contiguous f32 CPU tensor"),
    }
}

/// Calls `f` with the f32 values of `t` (row-major): borrowed from candle's
/// storage when `t` is a contiguous f32 CPU tensor, otherwise a converted
/// copy.
pub fn with_values<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    {
        let (storage, layout) = t.storage_and_layout();
        if let Storage::Cpu(cpu) = &*storage
            && let Some(values) = f32_range(cpu, layout)
        {
            return Ok(f(values));
        }
    }
    let values = t
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_device(&candle_core::Device::Cpu)?
        .to_vec1::<f32>()?;
    Ok(f(&values))
}

/// Overwrites `var`'s values with `values` (row-major), in place; a count
/// other than the variable's is [`gradwire_optim::OptimError::ShapeMismatch`].
pub fn write_values(var: &Var, values: &[f32]) -> Result<()> {
    write_tensor(var.as_tensor(), values)
}

/// [`write_values`] into any contiguous f32 CPU tensor (DataParallel's
/// combined gradients, written into the same tensors every step).
pub(crate) fn write_tensor(tensor: &Tensor, values: &[f32]) -> Result<()> {
    struct Write<'a>(&'a [f32]);
    impl InplaceOp1 for Write<'_> {
        fn name(&self) -> &'static str {
            "gradwire-write"
        }
        fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
            let dst = f32_range_mut(storage, layout, self.name())?;
            if dst.len() != self.0.len() {
                // The count was checked against the variable's before.
                candle_core::bail!("gradwire-write: the storage does not hold the variable");
            }
            dst.copy_from_slice(self.0);
            Ok(())
        }
    }
    let elements = tensor.elem_count();
    if values.len() != elements {
        return Err(OptimError::ShapeMismatch {
            what: "gradwire-candle: values written into a variable".into(),
            expected: vec![elements],
            got: vec![values.len()],
        }
        .into());
    }
    Ok(tensor.inplace_op1(&Write(values))?)
}

/// Calls `f(parameter, gradient)` with `var`'s values, mutably, and
/// `grad`'s: the parameter updated in place, in candle's storage. `grad`
/// is read in place when it is a contiguous f32 CPU tensor, otherwise
/// converted first. An error of `f` comes back as it was (typed).
pub fn update_in_place(
    var: &Var,
    grad: &Tensor,
    f: impl FnMut(&mut [f32], &[f32]) -> Result<()>,
) -> Result<()> {
    /// The closure, and its error kept typed across candle's op (which
    /// only carries candle's errors).
    struct Update<F> {
        f: RefCell<F>,
        failed: RefCell<Option<Error>>,
    }
    impl<F: FnMut(&mut [f32], &[f32]) -> Result<()>> InplaceOp2 for Update<F> {
        fn name(&self) -> &'static str {
            "gradwire-update"
        }
        fn cpu_fwd(
            &self,
            dst: &mut CpuStorage,
            dst_l: &Layout,
            src: &CpuStorage,
            src_l: &Layout,
        ) -> candle_core::Result<()> {
            let p = f32_range_mut(dst, dst_l, self.name())?;
            let Some(g) = f32_range(src, src_l) else {
                candle_core::bail!("gradwire-update: the gradient is not contiguous f32");
            };
            (self.f.borrow_mut())(p, g).map_err(|e| {
                let message = candle_core::Error::msg(e.to_string());
                *self.failed.borrow_mut() = Some(e);
                message
            })
        }
    }
    let readable = grad.dtype() == DType::F32
        && grad.device().is_cpu()
        && grad.layout().contiguous_offsets().is_some();
    let grad = if readable {
        grad.clone()
    } else {
        grad.to_dtype(DType::F32)?
            .to_device(&candle_core::Device::Cpu)?
            .contiguous()?
            .copy()?
    };
    let update = Update {
        f: RefCell::new(f),
        failed: RefCell::new(None),
    };
    let done = var.as_tensor().inplace_op2(&grad, &update);
    match (update.failed.into_inner(), done) {
        (Some(e), _) => Err(e),
        (None, done) => Ok(done?),
    }
}

/// gradwire copies of `vars`' values (a checkpoint's parameters, a
/// trajectory snapshot), in order.
pub fn parameters_of(vars: &[(String, Var)]) -> Result<Vec<GwTensor>> {
    vars.iter()
        .map(|(_, var)| {
            let values = with_values(var.as_tensor(), <[f32]>::to_vec)?;
            Ok(GwTensor::from_vec(values, var.dims().to_vec())?)
        })
        .collect()
}

/// The values of `vars` saved in `ckpt` (`param/<name>`, as
/// [`Checkpoint::set_parameters`] stores them), as gradwire tensors of the
/// variables' shapes; an error, changing nothing, if one is missing or of
/// another length.
pub fn parameters_in(ckpt: &Checkpoint, vars: &[(String, Var)]) -> Result<Vec<GwTensor>> {
    vars.iter()
        .map(|(name, var)| {
            let flat = ckpt.flat_parameters(&[name.as_str()])?;
            Ok(GwTensor::from_vec(flat, var.dims().to_vec())?)
        })
        .collect()
}
