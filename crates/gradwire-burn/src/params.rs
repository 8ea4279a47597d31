//! A burn module's float parameters as gradwire sees them: their names
//! (the module paths burn's records use, `fc1.weight`), ids and shapes in
//! the order burn visits them, which every worker shares; their values
//! read as f32 and written back in the parameter's own dtype; gradients
//! read from and written into a [`GradientsParams`].
//!
//! burn's tensors carry their rank in the type (`Tensor<D>`), so every
//! access walks the module with a visitor or mapper, which sees each
//! parameter with its rank.

use crate::{Error, Result};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{DType, Tensor, TensorData};
use gradwire_optim::{OptimError, ParamSpec};

/// One float parameter of a module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamEntry {
    /// Its path in the module (`fc1.weight`): the name gradwire declares
    /// and checkpoints it under.
    pub name: String,
    /// burn's id of it (kept across optimizer steps).
    pub id: ParamId,
    /// Its dimensions.
    pub shape: Vec<usize>,
}

/// Joins the module path of the parameter being visited.
#[derive(Default)]
struct Path(Vec<String>);

impl Path {
    fn enter(&mut self, name: &str) {
        self.0.push(name.to_owned());
    }
    fn exit(&mut self) {
        self.0.pop();
    }
    fn name(&self) -> String {
        self.0.join(".")
    }
}

/// The float parameters of `module`, in the order burn visits them (the
/// order of the fields, the same on every worker that builds the same
/// model). Two parameters with one path (a model that shares a module
/// under one name twice) are an error.
pub fn parameters_of<M: Module>(module: &M) -> Result<Vec<ParamEntry>> {
    struct Entries {
        path: Path,
        out: Vec<ParamEntry>,
    }
    impl ModuleVisitor for Entries {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.enter(name);
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.exit();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.out.push(ParamEntry {
                name: self.path.name(),
                id: param.id,
                shape: param.lazy_shape().dims::<D>().to_vec(),
            });
        }
    }
    let mut entries = Entries {
        path: Path::default(),
        out: Vec::new(),
    };
    module.visit(&mut entries);
    let mut names: Vec<&str> = entries.out.iter().map(|e| e.name.as_str()).collect();
    names.sort_unstable();
    if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(OptimError::InvalidArgument(format!(
            "gradwire-burn: two parameters are named {}",
            pair[0]
        ))
        .into());
    }
    Ok(entries.out)
}

/// gradwire's declarations of `entries` (names and shapes, f32: gradwire
/// combines every float parameter in f32 and writes it back in its own
/// dtype).
pub fn specs_of(entries: &[ParamEntry]) -> Vec<ParamSpec> {
    entries
        .iter()
        .map(|e| ParamSpec::new(e.name.clone(), e.shape.clone()))
        .collect()
}

/// `tensor`'s values as f32 (converted from its dtype), row-major.
fn values_of<const D: usize>(tensor: Tensor<D>, what: impl FnOnce() -> String) -> Result<Vec<f32>> {
    tensor.try_into_vec_as::<f32>().map_err(|e| Error::Burn {
        what: what(),
        detail: e.to_string(),
    })
}

/// Walks `module`'s float parameters in order, checking each against
/// `entries` (the declared ones): `f(index, param)` for each that matches;
/// a parameter that is not the declared one (another id, a module of
/// another structure) is an error, as are missing ones.
struct Checked<'e, F> {
    entries: &'e [ParamEntry],
    next: usize,
    error: Option<Error>,
    f: F,
}

impl<'e, F> Checked<'e, F> {
    fn new(entries: &'e [ParamEntry], f: F) -> Self {
        Checked {
            entries,
            next: 0,
            error: None,
            f,
        }
    }

    /// The declared index of `id`, the next in order, or the error.
    fn index_of(&mut self, id: ParamId) -> Option<usize> {
        let index = self.next;
        self.next += 1;
        match self.entries.get(index) {
            Some(entry) if entry.id == id => Some(index),
            entry => {
                self.error.get_or_insert_with(|| {
                    OptimError::InvalidArgument(format!(
                        "gradwire-burn: parameter {index} of the module is not the one declared \
                         ({}): pass the module DataParallel was built over",
                        entry.map_or("none", |e| e.name.as_str())
                    ))
                    .into()
                });
                None
            }
        }
    }

    fn finish(self) -> Result<F> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if self.next != self.entries.len() {
            return Err(OptimError::InvalidArgument(format!(
                "gradwire-burn: the module has {} float parameters, {} declared",
                self.next,
                self.entries.len()
            ))
            .into());
        }
        Ok(self.f)
    }
}

/// The values of every parameter of `module` as f32, in declared order.
pub(crate) fn read_parameters<M: Module>(
    module: &M,
    entries: &[ParamEntry],
) -> Result<Vec<Vec<f32>>> {
    struct Read<'e>(Checked<'e, Vec<Vec<f32>>>);
    impl ModuleVisitor for Read<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let Some(index) = self.0.index_of(param.id) else {
                return;
            };
            let name = &self.0.entries[index].name;
            match values_of(param.val(), || format!("the parameter {name}")) {
                Ok(values) => self.0.f.push(values),
                Err(e) => {
                    self.0.error.get_or_insert(e);
                }
            }
        }
    }
    let mut read = Read(Checked::new(entries, Vec::with_capacity(entries.len())));
    module.visit(&mut read);
    read.0.finish()
}

/// `module` with the parameters `values` holds replaced (declared order;
/// `None` keeps one as it is), each in its own dtype, on its own device,
/// tracking gradients as before. The count of values was checked by the
/// caller; a module that is not the declared one is an error.
pub(crate) fn write_parameters<M: Module>(
    module: M,
    entries: &[ParamEntry],
    values: &mut [Option<Vec<f32>>],
) -> Result<M> {
    struct Write<'e, 'v>(Checked<'e, &'v mut [Option<Vec<f32>>]>);
    impl ModuleMapper for Write<'_, '_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let Some(index) = self.0.index_of(param.id) else {
                return param;
            };
            let Some(values) = self.0.f.get_mut(index).and_then(Option::take) else {
                return param;
            };
            param.map(|tensor| with_values(tensor, values))
        }
    }
    let mut write = Write(Checked::new(entries, values));
    let module = module.map(&mut write);
    write.0.finish().map(|_| module)
}

/// A tensor like `tensor` (shape, dtype, device with its autodiff and
/// checkpointing, gradient tracking) holding `values`.
fn with_values<const D: usize>(tensor: Tensor<D>, values: Vec<f32>) -> Tensor<D> {
    let dtype: DType = tensor.dtype();
    let data = TensorData::new(values, tensor.shape()).convert_dtype(dtype);
    let fresh = Tensor::<D>::from_data(data, &tensor.device());
    if tensor.is_require_grad() {
        fresh.require_grad()
    } else {
        fresh
    }
}

/// Calls `f(index, values)` for every parameter of `module` that `grads`
/// holds a gradient for (its values as f32); parameters without one are
/// passed over. A gradient burn cannot read, or a module that is not the
/// declared one, is an error (after the others were handed over).
pub(crate) fn each_gradient<M: Module>(
    module: &M,
    entries: &[ParamEntry],
    grads: &GradientsParams,
    f: impl FnMut(usize, &[f32]),
) -> Result<()> {
    struct Each<'e, 'g, F> {
        checked: Checked<'e, F>,
        grads: &'g GradientsParams,
    }
    impl<F: FnMut(usize, &[f32])> ModuleVisitor for Each<'_, '_, F> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let Some(index) = self.checked.index_of(param.id) else {
                return;
            };
            let Some(grad) = self.grads.get::<D>(param.id) else {
                return; // not used in this forward pass
            };
            let name = &self.checked.entries[index].name;
            match values_of(grad, || format!("the gradient of {name}")) {
                Ok(values) => (self.checked.f)(index, &values),
                Err(e) => {
                    self.checked.error.get_or_insert(e);
                }
            }
        }
    }
    let mut each = Each {
        checked: Checked::new(entries, f),
        grads,
    };
    module.visit(&mut each);
    each.checked.finish().map(drop)
}

/// The gradients `values` holds (declared order; `None`: none) as burn's
/// [`GradientsParams`] for `module`'s parameters, each on its
/// parameter's device without autodiff, in its dtype.
pub(crate) fn gradients_from<M: Module>(
    module: &M,
    entries: &[ParamEntry],
    values: &mut [Option<Vec<f32>>],
) -> Result<GradientsParams> {
    struct Build<'e, 'v> {
        checked: Checked<'e, &'v mut [Option<Vec<f32>>]>,
        grads: GradientsParams,
    }
    impl ModuleVisitor for Build<'_, '_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let Some(index) = self.checked.index_of(param.id) else {
                return;
            };
            let Some(values) = self.checked.f.get_mut(index).and_then(Option::take) else {
                return;
            };
            let tensor = param.val();
            let data = TensorData::new(values, tensor.shape()).convert_dtype(tensor.dtype());
            let grad = Tensor::<D>::from_data(data, &tensor.device().without_autodiff());
            self.grads.register(param.id, grad);
        }
    }
    let mut build = Build {
        checked: Checked::new(entries, values),
        grads: GradientsParams::new(),
    };
    module.visit(&mut build);
    let grads = build.grads;
    build.checked.finish().map(|_| grads)
}
