//! `SparseVec`: the selected (index, value) pairs of a dense buffer.
//!
//! What every sparse codec produces and the wire format carries: indices
//! strictly increasing and below `dense_len`, one value per index.

use crate::error::{CompressError, Result};

/// A sparse view of a dense vector: `values[i]` sits at `indices[i]`.
///
/// Invariants (checked by [`SparseVec::new`], kept by every codec): indices
/// are strictly increasing and below `dense_len`, `dense_len` fits the wire's
/// u32 indices, and there are as many values as indices.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SparseVec {
    dense_len: usize,
    indices: Vec<u32>,
    values: Vec<f32>,
}

impl SparseVec {
    /// Checks the invariants and builds the sparse vector.
    pub fn new(dense_len: usize, indices: Vec<u32>, values: Vec<f32>) -> Result<SparseVec> {
        check_dense_len(dense_len)?;
        if indices.len() != values.len() {
            return Err(CompressError::LengthMismatch {
                op: "SparseVec::new",
                expected: indices.len(),
                got: values.len(),
            });
        }
        if let Some(w) = indices.windows(2).position(|w| w[0] >= w[1]) {
            return Err(CompressError::InvalidArgument(format!(
                "indices must be strictly increasing: {} then {} at position {w}",
                indices[w],
                indices[w + 1]
            )));
        }
        if let Some(&last) = indices.last()
            && last as usize >= dense_len
        {
            return Err(CompressError::InvalidArgument(format!(
                "index {last} out of range for a dense length of {dense_len}"
            )));
        }
        Ok(SparseVec {
            dense_len,
            indices,
            values,
        })
    }

    /// Empties it for a new selection from `dense_len` elements, keeping
    /// the buffers (the codecs refill it in place).
    pub(crate) fn reset(&mut self, dense_len: usize) {
        self.dense_len = dense_len;
        self.indices.clear();
        self.values.clear();
    }

    /// The index and value lists, for a codec filling them in place (it
    /// keeps the type's invariants).
    pub(crate) fn parts_mut(&mut self) -> (&mut Vec<u32>, &mut Vec<f32>) {
        (&mut self.indices, &mut self.values)
    }

    /// Builds without checking; the codecs use it for what they produce.
    pub(crate) fn from_parts_unchecked(
        dense_len: usize,
        indices: Vec<u32>,
        values: Vec<f32>,
    ) -> SparseVec {
        debug_assert!(SparseVec::new(dense_len, indices.clone(), values.clone()).is_ok());
        SparseVec {
            dense_len,
            indices,
            values,
        }
    }

    /// An empty selection of a dense buffer of `dense_len` elements.
    pub fn empty(dense_len: usize) -> Result<SparseVec> {
        check_dense_len(dense_len)?;
        Ok(SparseVec {
            dense_len,
            indices: Vec::new(),
            values: Vec::new(),
        })
    }

    /// Length of the dense vector this selects from.
    pub fn dense_len(&self) -> usize {
        self.dense_len
    }

    /// Number of selected entries.
    pub fn nnz(&self) -> usize {
        self.indices.len()
    }

    /// The selected indices, strictly increasing.
    pub fn indices(&self) -> &[u32] {
        &self.indices
    }

    /// The selected values, one per index.
    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// Splits into (dense length, indices, values).
    pub fn into_parts(self) -> (usize, Vec<u32>, Vec<f32>) {
        (self.dense_len, self.indices, self.values)
    }

    /// `dense[indices[i]] += values[i]`: the receiver side of a sparse
    /// all-reduce. `dense` must have `dense_len` elements.
    pub fn scatter_add(&self, dense: &mut [f32]) -> Result<()> {
        if dense.len() != self.dense_len {
            return Err(CompressError::LengthMismatch {
                op: "scatter_add",
                expected: self.dense_len,
                got: dense.len(),
            });
        }
        for (&i, &v) in self.indices.iter().zip(&self.values) {
            // In range by the type's invariant; `get_mut` keeps it panic-free
            // even if that were ever broken.
            if let Some(d) = dense.get_mut(i as usize) {
                *d += v;
            }
        }
        Ok(())
    }

    /// The dense vector: zeros except at the selected indices.
    pub fn to_dense(&self) -> Vec<f32> {
        let mut dense = vec![0f32; self.dense_len];
        for (&i, &v) in self.indices.iter().zip(&self.values) {
            if let Some(d) = dense.get_mut(i as usize) {
                *d = v;
            }
        }
        dense
    }
}

/// The wire format indexes with u32: a longer buffer must be split first
/// (DistOpt's buckets are far smaller).
pub(crate) fn check_dense_len(dense_len: usize) -> Result<()> {
    if dense_len > u32::MAX as usize + 1 {
        Err(CompressError::TooLong(dense_len))
    } else {
        Ok(())
    }
}
