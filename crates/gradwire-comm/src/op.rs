//! Reduction operators.

use crate::element::ElemType;
use std::fmt;

/// How a reduction combines the ranks' values, element by element.
///
/// Sums are taken in rank order 0, 1, ..., W-1 (f16 and bf16 accumulate in
/// f32 and round once at the end), so a result is bitwise the same on every
/// rank and in every run. `Max` and `Min` propagate NaN: if any rank holds a
/// NaN at an index, the result there is NaN. The one backend setting that
/// trades the rank order for speed says so: NcclComm's default,
/// `NcclReduction::Native`, sums with NCCL's own algorithm (its order, and
/// half types in half precision); its `Max` and `Min` still propagate NaN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (wrapping for integers).
    Sum,
    /// Sum divided by the world size (floating-point types only).
    Avg,
    /// Element-wise maximum.
    Max,
    /// Element-wise minimum.
    Min,
}

impl ReduceOp {
    /// Every operator, for tests and command lines.
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];

    /// Whether this operator is defined for the element type (`Avg` is not
    /// defined for integers: an integer mean would silently truncate).
    pub fn supports(self, elem: ElemType) -> bool {
        self != ReduceOp::Avg || elem.is_float()
    }

    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
