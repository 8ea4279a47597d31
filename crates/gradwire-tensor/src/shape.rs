//! [`Shape`]: the dimensions of a contiguous tensor.
//!
//! Tensors in gradwire are always contiguous and row-major, so a shape is just
//! a list of dimensions; the element count is what the communication and
//! fusion code actually uses. Conversions from tuples, arrays, slices and
//! vectors are infallible so call sites stay short; the overflow check on the
//! element count happens where it matters, when a tensor or a flat layout is
//! built ([`Shape::checked_elem_count`] returns [`Error::ShapeOverflow`]).

use std::fmt;

use crate::error::{Error, Result};

/// The dimensions of a tensor, outermost first. `Shape::scalar()` (no
/// dimensions) has one element; any zero dimension gives zero elements.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(Vec<usize>);

impl Shape {
    /// A shape from its dimensions.
    pub fn new(dims: Vec<usize>) -> Self {
        Shape(dims)
    }

    /// The shape of a scalar: rank 0, one element.
    pub fn scalar() -> Self {
        Shape(Vec::new())
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The number of elements (product of the dimensions, 1 for a scalar).
    ///
    /// Saturates at `usize::MAX` instead of wrapping, so an absurd shape can
    /// never masquerade as a small one; such a shape never matches a real
    /// buffer, and every constructor rejects it through
    /// [`Shape::checked_elem_count`]. The shape of an existing tensor always
    /// has an exact count.
    pub fn elem_count(&self) -> usize {
        self.checked_elem_count().unwrap_or(usize::MAX)
    }

    /// The number of elements, or [`Error::ShapeOverflow`] if the product of
    /// the dimensions does not fit in `usize`.
    pub fn checked_elem_count(&self) -> Result<usize> {
        self.0
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or(Error::ShapeOverflow)
    }

    /// Consumes the shape, returning its dimensions.
    pub fn into_dims(self) -> Vec<usize> {
        self.0
    }
}

impl fmt::Display for Shape {
    /// Formats like `[2, 3]`; a scalar is `[]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl From<usize> for Shape {
    /// A rank-1 shape.
    fn from(n: usize) -> Self {
        Shape(vec![n])
    }
}

impl From<(usize, usize)> for Shape {
    fn from((a, b): (usize, usize)) -> Self {
        Shape(vec![a, b])
    }
}

impl From<(usize, usize, usize)> for Shape {
    fn from((a, b, c): (usize, usize, usize)) -> Self {
        Shape(vec![a, b, c])
    }
}

impl From<&[usize]> for Shape {
    fn from(dims: &[usize]) -> Self {
        Shape(dims.to_vec())
    }
}

impl From<Vec<usize>> for Shape {
    fn from(dims: Vec<usize>) -> Self {
        Shape(dims)
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Self {
        Shape(dims.to_vec())
    }
}

impl<const N: usize> From<&[usize; N]> for Shape {
    fn from(dims: &[usize; N]) -> Self {
        Shape(dims.to_vec())
    }
}

impl From<&Shape> for Shape {
    fn from(s: &Shape) -> Self {
        s.clone()
    }
}

impl From<()> for Shape {
    /// The scalar shape.
    fn from((): ()) -> Self {
        Shape::scalar()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_display() {
        assert_eq!(Shape::scalar().elem_count(), 1);
        assert_eq!(Shape::scalar().rank(), 0);
        assert_eq!(Shape::scalar().to_string(), "[]");
        let s = Shape::from((2, 3));
        assert_eq!(s.elem_count(), 6);
        assert_eq!(s.rank(), 2);
        assert_eq!(s.to_string(), "[2, 3]");
        assert_eq!(Shape::from([4, 0, 7]).elem_count(), 0);
        assert_eq!(Shape::from(5).dims(), &[5]);
        assert_eq!(Shape::from(&[1usize, 2][..]), Shape::from(vec![1, 2]));
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        let s = Shape::from([usize::MAX, 2]);
        assert_eq!(s.checked_elem_count(), Err(Error::ShapeOverflow));
        assert_eq!(s.elem_count(), usize::MAX);
        // A zero dimension anywhere still wins over a huge one.
        assert_eq!(Shape::from([0, usize::MAX]).checked_elem_count(), Ok(0));
    }
}
