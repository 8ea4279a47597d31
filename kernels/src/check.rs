//! The check of a launch against its kernel's signature, before anything
//! runs: the count of arguments; each value's C type; each buffer's access
//! (a buffer the kernel writes must be borrowed mutably), element type and
//! length against the elements the kernel may touch through it; the grid.
//!
//! One implementation for every way gradwire runs a kernel: gradwire-tensor's
//! typed launch on a GPU (which adds the device of each buffer) and
//! gradwire-kernels-host's execution on the CPU.

use crate::signature::{Access, CType, Grid, Kernel, LaunchShape, Param};

/// What the check knows of an argument.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Operand {
    /// A buffer of `len` elements of `elem`, written (borrowed mutably) or
    /// only read.
    Memory {
        /// Whether the argument is borrowed mutably.
        writes: bool,
        /// The element type.
        elem: CType,
        /// The elements it holds.
        len: usize,
    },
    /// A null pointer.
    Null,
    /// A value of C type `ty`; `integer` is the value as an extent reads it
    /// (`None` for a float or a negative integer).
    Value {
        /// The C type.
        ty: CType,
        /// The value, when it is a non-negative integer.
        integer: Option<u64>,
    },
}

/// Why a launch is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The elements a pointer may touch overflow `u64` (or cannot be
    /// computed).
    Overflow {
        /// The parameter's position.
        param: usize,
    },
    /// The arguments or the grid are not what the kernel declares.
    Invalid(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Overflow { param } => {
                write!(f, "parameter {param}: the elements it may touch overflow")
            }
            Refusal::Invalid(why) => f.write_str(why),
        }
    }
}

/// The most parameters a kernel may have (the widest has 12).
const MAX_PARAMS: usize = 16;

impl Kernel {
    /// Whether `args` on a grid of `grid.0 x grid.1` blocks are what this
    /// kernel declares. Allocates nothing unless it refuses: it runs before
    /// every launch.
    pub fn check(
        &self,
        args: impl ExactSizeIterator<Item = Operand> + Clone,
        grid: (u32, u32),
    ) -> Result<(), Refusal> {
        let params = self.params();
        if args.len() != params.len() {
            return Err(Refusal::Invalid(format!(
                "{} arguments for {} parameters",
                args.len(),
                params.len()
            )));
        }
        if self.grid() == Grid::OneBlock && grid != (1, 1) {
            return Err(Refusal::Invalid(format!(
                "a single-block kernel launched on {grid:?} blocks"
            )));
        }
        if params.len() > MAX_PARAMS {
            return Err(Refusal::Invalid(format!(
                "more than {MAX_PARAMS} parameters"
            )));
        }
        let mut integers = [None; MAX_PARAMS];
        for (slot, arg) in integers.iter_mut().zip(args.clone()) {
            if let Operand::Value { integer, .. } = arg {
                *slot = integer;
            }
        }
        let shape = LaunchShape::new(&integers[..params.len()], grid);
        for (i, (param, arg)) in params.iter().zip(args).enumerate() {
            let mismatch = |what: String| Refusal::Invalid(format!("parameter {i}: {what}"));
            match (param, arg) {
                (Param::Value(ty), Operand::Value { ty: got, .. }) if got == *ty => {}
                (Param::Value(ty), _) => {
                    return Err(mismatch(format!("expected a {ty:?} value")));
                }
                (Param::Pointer { nullable: true, .. }, Operand::Null) => {}
                (
                    Param::Pointer {
                        elem,
                        access,
                        extent,
                        ..
                    },
                    Operand::Memory {
                        writes,
                        elem: got,
                        len,
                    },
                ) => {
                    if (*access == Access::Write) != writes {
                        return Err(mismatch(format!(
                            "the kernel's access is {access:?}, the argument's the other"
                        )));
                    }
                    if got != *elem {
                        return Err(mismatch(format!("{got:?} elements for {elem:?}")));
                    }
                    let needed = extent(&shape).ok_or(Refusal::Overflow { param: i })?;
                    if u64::try_from(len).map_or(true, |len| len < needed) {
                        return Err(mismatch(format!(
                            "{len} elements where the kernel may touch {needed}"
                        )));
                    }
                }
                (Param::Pointer { .. }, _) => {
                    return Err(mismatch("expected device memory".into()));
                }
            }
        }
        Ok(())
    }

    /// The elements `self` may touch through pointer parameter `param` on
    /// `grid` given the integer arguments `integers` (by position): `None`
    /// when `param` is not a pointer or its extent overflows.
    pub fn extent(&self, param: usize, integers: &[Option<u64>], grid: (u32, u32)) -> Option<u64> {
        match self.params().get(param)? {
            Param::Pointer { extent, .. } => extent(&LaunchShape::new(integers, grid)),
            Param::Value(_) => None,
        }
    }
}
