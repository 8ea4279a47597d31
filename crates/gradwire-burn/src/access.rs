//! A burn module as GradSync's [`ParamAccess`]: the loops that step the
//! parameters themselves (local steps, DimReduce's line search) read and
//! write them through it. burn's parameters are immutable tensors, so the
//! values are read once per module state (one walk over the module) and
//! writes are gathered and applied in one walk, when the module is next
//! needed.

use crate::Result;
use crate::params::{ParamEntry, read_parameters, write_parameters};
use burn::module::Module;
use gradwire_optim::{OptimError, ParamAccess};

/// A module whose parameters GradSync reads and writes.
pub(crate) struct ModuleAccess<'e, M> {
    /// The module; `None` only while a local step holds it.
    module: Option<M>,
    entries: &'e [ParamEntry],
    /// Its parameters' values, once read (with the pending writes in).
    values: Option<Vec<Vec<f32>>>,
    /// Values written and not yet in the module.
    pending: Vec<Option<Vec<f32>>>,
}

impl<'e, M: Module> ModuleAccess<'e, M> {
    pub(crate) fn new(module: M, entries: &'e [ParamEntry]) -> Self {
        ModuleAccess {
            module: Some(module),
            entries,
            values: None,
            pending: vec![None; entries.len()],
        }
    }

    /// The module, taken out; `None` only while [`ModuleAccess::replace`]
    /// or [`ModuleAccess::apply`] holds it.
    fn take(&mut self) -> Result<M> {
        self.module
            .take()
            .ok_or_else(|| OptimError::InvalidArgument("the module is being stepped".into()).into())
    }

    /// The module with every write in.
    pub(crate) fn module(&mut self) -> Result<&M> {
        self.apply()?;
        self.module
            .as_ref()
            .ok_or_else(|| OptimError::InvalidArgument("the module is being stepped".into()).into())
    }

    /// Hands the module (writes in) to `step`, which returns its next
    /// state (an optimizer's step); the values are read again after.
    pub(crate) fn replace(&mut self, step: impl FnOnce(M) -> M) -> Result<()> {
        self.apply()?;
        let module = self.take()?;
        self.values = None;
        self.module = Some(step(module));
        Ok(())
    }

    /// The module with every write in, given back.
    pub(crate) fn into_module(mut self) -> Result<M> {
        self.apply()?;
        self.take()
    }

    fn apply(&mut self) -> Result<()> {
        if self.pending.iter().all(Option::is_none) {
            return Ok(());
        }
        let module = self.take()?;
        self.module = Some(write_parameters(module, self.entries, &mut self.pending)?);
        Ok(())
    }

    /// Reads the module's values, for the reads GradSync makes next
    /// (`read` takes `&self`): call before handing the access over, and
    /// after each [`ModuleAccess::replace`].
    pub(crate) fn load(&mut self) -> Result<()> {
        if self.values.is_none() {
            let entries = self.entries;
            let values = read_parameters(self.module()?, entries)?;
            self.values = Some(values);
        }
        Ok(())
    }
}

impl<M: Module> ParamAccess for ModuleAccess<'_, M> {
    fn read(&self, index: usize, out: &mut [f32]) -> gradwire_optim::Result<()> {
        let values = self.values.as_ref().ok_or_else(|| {
            OptimError::InvalidArgument(
                "gradwire-burn: parameters read before they were loaded".into(),
            )
        })?;
        let value = values
            .get(index)
            .ok_or_else(|| OptimError::InvalidArgument(format!("no parameter {index}")))?;
        if value.len() != out.len() {
            return Err(OptimError::InvalidArgument(format!(
                "{} has {} values, {} declared",
                self.entries[index].name,
                value.len(),
                out.len()
            )));
        }
        out.copy_from_slice(value);
        Ok(())
    }

    fn write(&mut self, index: usize, values: &[f32]) -> gradwire_optim::Result<()> {
        let slot = self
            .pending
            .get_mut(index)
            .ok_or_else(|| OptimError::InvalidArgument(format!("no parameter {index}")))?;
        *slot = Some(values.to_vec());
        if let Some(cached) = self.values.as_mut().and_then(|v| v.get_mut(index)) {
            cached.clear();
            cached.extend_from_slice(values);
        }
        Ok(())
    }
}
