//! The sparse-selection primitives of `kernels/cuda/select.cu` on f32
//! device buffers: a [`Selection`] (a magnitude key `t` and how many of the
//! entries equal to it to keep) found on the device by a threshold, a radix
//! select of the k-th largest magnitude, or a strided sample's order
//! statistic, then applied by [`compact`] into a [`DeviceSparse`] list with
//! strictly increasing indices and the values exactly as in the input.
//!
//! gradwire-compress composes these into the device forms of its codecs
//! (threshold, exact top-k with ties to the lower indices, sampled top-k),
//! which then select exactly what its CPU functions select.

use std::sync::Arc;

use gradwire_kernels::{plan, select as k};
use gradwire_tensor::cuda_backend::launch::{Blocks, Launch, require_f32};
use gradwire_tensor::cuda_backend::{
    CudaDevice, DeviceVec, NO_INDEX, first_index_cell, read_first_index,
};
use gradwire_tensor::{CudaStorage, DType, Error, Result};

/// A selection on the device: keep every entry whose magnitude key is above
/// `key`, and the first `ties` (in index order) of those equal to it. Four
/// u64 in device memory (`key`, `ties`, and the radix select's working
/// values), so that selections are found and applied without a round trip.
#[derive(Debug)]
pub struct Selection {
    device: Arc<CudaDevice>,
    state: DeviceVec<u64>,
    /// `ties` when the host knows it (every tie kept: a threshold), so that
    /// [`compact`] need not read it back; `None` after a radix select.
    ties_on_host: Option<u64>,
}

impl Selection {
    /// Every entry whose magnitude key (`bits & 0x7fff_ffff`, ordered like
    /// `|x|` for finite values) is `>= key`: a threshold.
    pub fn at_least(device: &Arc<CudaDevice>, key: u32) -> Result<Selection> {
        Ok(Selection {
            device: Arc::clone(device),
            state: DeviceVec::from_host(device, &[u64::from(key), NO_INDEX, 0, 0])?,
            ties_on_host: Some(NO_INDEX),
        })
    }

    /// Keeps every entry equal to the key instead of the first `ties` (the
    /// threshold of sampled top-k: the sample's order statistic).
    pub fn keep_all_ties(&mut self) -> Result<()> {
        Launch::new(&self.device, &k::SELECTION_ALL_TIES)
            .write(&mut self.state)
            .run(Blocks::Exactly(1, 1))?;
        self.ties_on_host = Some(NO_INDEX);
        Ok(())
    }

    /// The selection's key and ties, on the host (waits for the stream).
    pub fn to_host(&self) -> Result<(u32, u64)> {
        let state = self.state.read(0..2)?;
        let key = state.first().copied().unwrap_or(0);
        let ties = state.get(1).copied().unwrap_or(0);
        Ok((u32::try_from(key).unwrap_or(u32::MAX), ties))
    }

    /// How many entries equal to the key to keep (read back only when the
    /// device found it).
    fn ties(&self) -> Result<u64> {
        match self.ties_on_host {
            Some(ties) => Ok(ties),
            None => Ok(self.to_host()?.1),
        }
    }
}

/// A sparse list on the device: `nnz` strictly increasing u32 indices into
/// a dense vector of `dense_len` elements, and their f32 values.
#[derive(Debug)]
pub struct DeviceSparse {
    dense_len: usize,
    nnz: usize,
    indices: DeviceVec<u32>,
    values: CudaStorage,
}

impl DeviceSparse {
    /// The length of the dense vector the indices point into.
    pub fn dense_len(&self) -> usize {
        self.dense_len
    }

    /// The number of entries.
    pub fn nnz(&self) -> usize {
        self.nnz
    }

    /// The [`DeviceSparse::nnz`] indices.
    pub fn indices(&self) -> &DeviceVec<u32> {
        &self.indices
    }

    /// The values, an f32 storage of [`DeviceSparse::nnz`] elements.
    pub fn values(&self) -> &CudaStorage {
        &self.values
    }

    /// Indices and values on the host (waits for the stream).
    pub fn to_host(&self) -> Result<(Vec<u32>, Vec<f32>)> {
        let indices = self.indices.to_host()?;
        let values = self.values.read_f32(0..self.nnz)?;
        Ok((indices, values))
    }
}

/// Indices are u32 on the wire and in these kernels.
fn check_indexable(op: &str, n: usize) -> Result<()> {
    if u64::try_from(n).is_ok_and(|n| n <= 1 << 32) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{op}: {n} elements cannot be indexed with u32"
        )))
    }
}

/// The smallest index of a NaN or an infinity in `x` (f32), or `None`.
pub fn first_non_finite(x: &CudaStorage) -> Result<Option<usize>> {
    require_f32("first_non_finite", x)?;
    let n = x.len();
    if n == 0 {
        return Ok(None);
    }
    let device = x.device();
    let mut first = first_index_cell(device)?;
    Launch::new(device, &k::FIRST_NON_FINITE_F32)
        .read(x)
        .len(n)
        .write(&mut first)
        .run(Blocks::Over(n))?;
    read_first_index(&first)
}

/// The selection of the `k`-th largest magnitude key of `x` (f32, finite:
/// callers check with [`first_non_finite`]) with the number of its equals
/// to keep, so that applying it keeps exactly `k` entries, ties to the lower
/// indices. A radix select on the device: four histogram passes of 8 bits.
/// `k` must lie in `1..=x.len()` ([`Error::InvalidArgument`]).
pub fn kth_largest(x: &CudaStorage, k_th: usize) -> Result<Selection> {
    const OP: &str = "kth_largest";
    require_f32(OP, x)?;
    let n = x.len();
    if k_th == 0 || k_th > n {
        return Err(Error::InvalidArgument(format!(
            "{OP}: k = {k_th} outside 1..={n}"
        )));
    }
    // The histogram kernel counts in u32 per block, which holds for u32-indexable inputs.
    check_indexable(OP, n)?;
    let device = Arc::clone(x.device());
    let mut state = DeviceVec::<u64>::zeros(&device, 4)?;
    let mut hist = DeviceVec::<u64>::zeros(&device, 256)?;
    Launch::new(&device, &k::RADIX_INIT)
        .write(&mut state)
        .write(&mut hist)
        .len(k_th)
        .run(Blocks::Exactly(1, 1))?;
    for shift in plan::RADIX_SHIFTS {
        Launch::new(&device, &k::RADIX_HISTOGRAM_F32)
            .read(x)
            .len(n)
            .read(&state)
            .write(&mut hist)
            .value(shift)
            .run(Blocks::Over(n))?;
        Launch::new(&device, &k::RADIX_SELECT_DIGIT)
            .write(&mut state)
            .write(&mut hist)
            .value(shift)
            .run(Blocks::Exactly(1, 1))?;
    }
    Ok(Selection {
        device,
        state,
        ties_on_host: None,
    })
}

/// The strided sample `x[0], x[stride], x[2 stride], ...` (f32), as a new
/// storage of `ceil(n / stride)` elements. `stride` must be at least 1.
pub fn sample_strided(x: &CudaStorage, stride: usize) -> Result<CudaStorage> {
    require_f32("sample_strided", x)?;
    if stride == 0 {
        return Err(Error::InvalidArgument("sample_strided: stride 0".into()));
    }
    let n = x.len();
    let m = n.div_ceil(stride);
    let mut out = CudaStorage::alloc_zeros(m, DType::F32, x.ordinal())?;
    if m == 0 {
        return Ok(out);
    }
    Launch::new(x.device(), &k::SAMPLE_STRIDED_F32)
        .read(x)
        .len(n)
        .len(stride)
        .write(&mut out)
        .run(Blocks::Over(m))?;
    Ok(out)
}

/// Applies `selection` to `x` (f32): the entries it keeps, in index order,
/// as a [`DeviceSparse`] over `dense_len` elements. With `src_index`, entry
/// `i` of `x` is reported as index `src_index[i]` (selecting among an
/// already compacted list: `x` is its values, `src_index` its indices, and
/// `dense_len` the original length).
pub fn compact(
    x: &CudaStorage,
    selection: &Selection,
    src_index: Option<&DeviceSparse>,
    dense_len: usize,
) -> Result<DeviceSparse> {
    const OP: &str = "compact";
    require_f32(OP, x)?;
    let n = x.len();
    check_indexable(OP, dense_len)?;
    if let Some(src) = src_index
        && src.nnz() != n
    {
        return Err(Error::LengthMismatch {
            op: OP,
            expected: n,
            got: src.nnz(),
        });
    }
    if src_index.is_none() && dense_len != n {
        return Err(Error::LengthMismatch {
            op: OP,
            expected: n,
            got: dense_len,
        });
    }
    let device = Arc::clone(x.device());
    let empty = |device: &Arc<CudaDevice>| -> Result<DeviceSparse> {
        Ok(DeviceSparse {
            dense_len,
            nnz: 0,
            indices: DeviceVec::zeros(device, 0)?,
            values: CudaStorage::alloc_zeros(0, DType::F32, device.ordinal())?,
        })
    };
    if n == 0 {
        return empty(&device);
    }
    let (tile, grid_tiles) = plan::select_tiles(n);
    let grid = Blocks::Exactly(grid_tiles, 1);
    let tiles = grid_tiles as usize;
    let mut counts_gt = DeviceVec::<u64>::zeros(&device, tiles)?;
    let mut counts_eq = DeviceVec::<u64>::zeros(&device, tiles)?;
    let mut totals = DeviceVec::<u64>::zeros(&device, 2)?;
    Launch::new(&device, &k::SELECT_COUNT_F32)
        .read(x)
        .len(n)
        .len(tile)
        .read(&selection.state)
        .write(&mut counts_gt)
        .write(&mut counts_eq)
        .write(&mut totals)
        .run(grid)?;
    let ties = selection.ties()?;
    let (above, equal) = match totals.to_host()?.as_slice() {
        [above, equal] => (*above, *equal),
        _ => return Err(Error::Cuda("select_count_f32 returned no totals".into())),
    };
    let nnz =
        usize::try_from(above.saturating_add(equal.min(ties))).map_err(|_| Error::ShapeOverflow)?;
    if nnz == 0 {
        return empty(&device);
    }
    let mut offsets_gt = DeviceVec::<u64>::zeros(&device, tiles + 1)?;
    let mut offsets_eq = DeviceVec::<u64>::zeros(&device, tiles + 1)?;
    for (counts, offsets) in [(&counts_gt, &mut offsets_gt), (&counts_eq, &mut offsets_eq)] {
        Launch::new(&device, &k::EXCLUSIVE_SCAN_U64)
            .read(counts)
            .len(tiles)
            .write(offsets)
            .run(Blocks::Exactly(1, 1))?;
    }
    let mut indices = DeviceVec::<u32>::zeros(&device, nnz)?;
    let mut values = CudaStorage::alloc_zeros(nnz, DType::F32, device.ordinal())?;
    Launch::new(&device, &k::SELECT_COMPACT_F32)
        .read(x)
        .len(n)
        .len(tile)
        .read(&selection.state)
        .read(&offsets_gt)
        .read(&offsets_eq)
        .read_or_null(src_index.map(DeviceSparse::indices))
        .write(&mut indices)
        .write(&mut values)
        .len(nnz)
        .run(grid)?;
    Ok(DeviceSparse {
        dense_len,
        nnz,
        indices,
        values,
    })
}

impl DeviceSparse {
    /// A list of host indices and device values, checked as the wire format
    /// checks a payload: indices strictly increasing and below `dense_len`,
    /// `values` f32 with one value per index.
    pub fn from_host_indices(
        dense_len: usize,
        indices: &[u32],
        values: CudaStorage,
    ) -> Result<DeviceSparse> {
        const OP: &str = "DeviceSparse::from_host_indices";
        require_f32(OP, &values)?;
        check_indexable(OP, dense_len)?;
        if values.len() != indices.len() {
            return Err(Error::LengthMismatch {
                op: OP,
                expected: indices.len(),
                got: values.len(),
            });
        }
        let increasing = indices.windows(2).all(|w| w[0] < w[1]);
        let in_range = indices
            .last()
            .is_none_or(|&last| (last as usize) < dense_len);
        if !increasing || !in_range {
            return Err(Error::InvalidArgument(format!(
                "{OP}: indices must be strictly increasing and below {dense_len}"
            )));
        }
        let device = Arc::clone(values.device());
        Ok(DeviceSparse {
            dense_len,
            nnz: indices.len(),
            indices: DeviceVec::from_host(&device, indices)?,
            values,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gradwire_tensor::cuda_backend::launch::{BLOCK, MAX_GRID};

    #[test]
    fn tiles_cover_the_input_with_at_most_max_grid_blocks() {
        for n in [
            1usize,
            2,
            255,
            256,
            257,
            4096 * 256,
            4096 * 256 + 1,
            10_000_019,
        ] {
            let (tile, tiles) = plan::select_tiles(n);
            let tiles = tiles as usize;
            assert_eq!(tile % BLOCK as usize, 0, "n={n}");
            assert!(tiles <= MAX_GRID as usize, "n={n}");
            assert!(tile * tiles >= n, "n={n}");
            assert!(tile * (tiles - 1) < n, "n={n}: an empty tile");
        }
    }
}
