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
use gradwire_tensor::cuda_backend::launch::{Blocks, Launch, require_f32, window};
use gradwire_tensor::cuda_backend::{CudaDevice, DeviceVec, NO_INDEX, read_first_index};
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
    /// `|x|` for finite values) is `>= key`: a threshold, in `scratch`'s
    /// kept state.
    pub fn at_least(
        device: &Arc<CudaDevice>,
        key: u32,
        scratch: &mut DeviceSelectScratch,
    ) -> Result<Selection> {
        let mut state = scratch.take_state(device)?;
        state.write_from_host(0, &[u64::from(key), NO_INDEX, 0, 0])?;
        Ok(Selection {
            device: Arc::clone(device),
            state,
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

/// The selections' working memory on one device, kept from call to call as
/// the CPU's `SelectScratch` is: the non-finite check's cell, a selection's
/// state, the radix select's histogram, the per-tile counts, totals and
/// offsets of [`compact`]. With it a steady step allocates only the
/// selection it returns. A clone is empty (the memory is working space,
/// not state).
#[derive(Debug, Default)]
pub struct DeviceSelectScratch {
    first: Option<DeviceVec<u64>>,
    state: Option<DeviceVec<u64>>,
    hist: Option<DeviceVec<u64>>,
    counts_gt: Option<DeviceVec<u64>>,
    counts_eq: Option<DeviceVec<u64>>,
    totals: Option<DeviceVec<u64>>,
    offsets_gt: Option<DeviceVec<u64>>,
    offsets_eq: Option<DeviceVec<u64>>,
}

impl Clone for DeviceSelectScratch {
    fn clone(&self) -> Self {
        DeviceSelectScratch::default()
    }
}

/// A selection's state: four u64.
const STATE_LEN: usize = 4;

impl DeviceSelectScratch {
    /// Keeps `selection`'s state for the next selection (once it has been
    /// applied).
    pub fn recycle(&mut self, selection: Selection) {
        self.state = Some(selection.state);
    }

    /// A selection's state on `device`: the kept one, or new zeros.
    fn take_state(&mut self, device: &Arc<CudaDevice>) -> Result<DeviceVec<u64>> {
        match self.state.take() {
            Some(state) if state.len() == STATE_LEN && state.ordinal() == device.ordinal() => {
                Ok(state)
            }
            _ => DeviceVec::zeros(device, STATE_LEN),
        }
    }

    /// A first-index cell on `device`, set to [`NO_INDEX`] (a kernel lowers
    /// it to the first index with the property).
    pub(crate) fn first_index_cell(
        &mut self,
        device: &Arc<CudaDevice>,
    ) -> Result<&mut DeviceVec<u64>> {
        let cell = DeviceVec::kept(&mut self.first, device, 1)?;
        cell.write_from_host(0, &[NO_INDEX])?;
        Ok(cell)
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

/// The smallest index of a NaN or an infinity in `x` (f32), or `None`;
/// the cell it is found in is `scratch`'s.
pub fn first_non_finite(
    x: &CudaStorage,
    scratch: &mut DeviceSelectScratch,
) -> Result<Option<usize>> {
    require_f32("first_non_finite", x)?;
    let n = x.len();
    if n == 0 {
        return Ok(None);
    }
    let device = x.device();
    let first = scratch.first_index_cell(device)?;
    Launch::new(device, &k::FIRST_NON_FINITE_F32)
        .read(x)
        .len(n)
        .write(window(&mut *first, 0..1))
        .run(Blocks::Over(n))?;
    read_first_index(first)
}

/// The selection of the `k`-th largest magnitude key of `x` (f32, finite:
/// callers check with [`first_non_finite`]) with the number of its equals
/// to keep, so that applying it keeps exactly `k` entries, ties to the lower
/// indices. A radix select on the device: four histogram passes of 8 bits.
/// `k` must lie in `1..=x.len()` ([`Error::InvalidArgument`]).
/// The state and the histogram are `scratch`'s.
pub fn kth_largest(
    x: &CudaStorage,
    k_th: usize,
    scratch: &mut DeviceSelectScratch,
) -> Result<Selection> {
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
    let mut state = scratch.take_state(&device)?;
    let hist = DeviceVec::kept(&mut scratch.hist, &device, RADIX_BINS)?;
    // radix_init sets the state and zeroes the histogram.
    Launch::new(&device, &k::RADIX_INIT)
        .write(&mut state)
        .write(window(&mut *hist, 0..RADIX_BINS))
        .len(k_th)
        .run(Blocks::Exactly(1, 1))?;
    for shift in plan::RADIX_SHIFTS {
        Launch::new(&device, &k::RADIX_HISTOGRAM_F32)
            .read(x)
            .len(n)
            .read(&state)
            .write(window(&mut *hist, 0..RADIX_BINS))
            .value(shift)
            .run(Blocks::Over(n))?;
        Launch::new(&device, &k::RADIX_SELECT_DIGIT)
            .write(&mut state)
            .write(window(&mut *hist, 0..RADIX_BINS))
            .value(shift)
            .run(Blocks::Exactly(1, 1))?;
    }
    Ok(Selection {
        device,
        state,
        ties_on_host: None,
    })
}

/// The radix select's histogram: one count per 8-bit digit.
const RADIX_BINS: usize = 256;

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
/// `dense_len` the original length). The per-tile counts and offsets are
/// `scratch`'s: only the list returned is allocated.
pub fn compact(
    x: &CudaStorage,
    selection: &Selection,
    src_index: Option<&DeviceSparse>,
    dense_len: usize,
    scratch: &mut DeviceSelectScratch,
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
    let DeviceSelectScratch {
        counts_gt,
        counts_eq,
        totals,
        offsets_gt,
        offsets_eq,
        ..
    } = scratch;
    let counts_gt = DeviceVec::kept(counts_gt, &device, tiles)?;
    let counts_eq = DeviceVec::kept(counts_eq, &device, tiles)?;
    let totals = DeviceVec::kept(totals, &device, 2)?;
    // The kernel adds every tile's counts into the totals.
    totals.write_from_host(0, &[0, 0])?;
    Launch::new(&device, &k::SELECT_COUNT_F32)
        .read(x)
        .len(n)
        .len(tile)
        .read(&selection.state)
        .write(window(&mut *counts_gt, 0..tiles))
        .write(window(&mut *counts_eq, 0..tiles))
        .write(window(&mut *totals, 0..2))
        .run(grid)?;
    let ties = selection.ties()?;
    let (above, equal) = match totals.read(0..2)?.as_slice() {
        [above, equal] => (*above, *equal),
        _ => return Err(Error::Cuda("select_count_f32 returned no totals".into())),
    };
    let nnz =
        usize::try_from(above.saturating_add(equal.min(ties))).map_err(|_| Error::ShapeOverflow)?;
    if nnz == 0 {
        return empty(&device);
    }
    let offsets_gt = DeviceVec::kept(offsets_gt, &device, tiles + 1)?;
    let offsets_eq = DeviceVec::kept(offsets_eq, &device, tiles + 1)?;
    for (counts, offsets) in [
        (&*counts_gt, &mut *offsets_gt),
        (&*counts_eq, &mut *offsets_eq),
    ] {
        Launch::new(&device, &k::EXCLUSIVE_SCAN_U64)
            .read(window(counts, 0..tiles))
            .len(tiles)
            .write(window(offsets, 0..tiles + 1))
            .run(Blocks::Exactly(1, 1))?;
    }
    let mut indices = DeviceVec::<u32>::zeros(&device, nnz)?;
    let mut values = CudaStorage::alloc_zeros(nnz, DType::F32, device.ordinal())?;
    Launch::new(&device, &k::SELECT_COMPACT_F32)
        .read(x)
        .len(n)
        .len(tile)
        .read(&selection.state)
        .read(window(&*offsets_gt, 0..tiles + 1))
        .read(window(&*offsets_eq, 0..tiles + 1))
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

/// The checks of a sparse list arriving from the host, as the wire format
/// checks a payload: one value per index, indices strictly increasing and
/// below `dense_len` (which u32 indices must reach). The scatter kernels
/// trust what passes.
pub(crate) fn check_host_list(
    op: &'static str,
    dense_len: usize,
    indices: &[u32],
    values: usize,
) -> Result<()> {
    check_indexable(op, dense_len)?;
    if values != indices.len() {
        return Err(Error::LengthMismatch {
            op,
            expected: indices.len(),
            got: values,
        });
    }
    let increasing = indices.windows(2).all(|w| w[0] < w[1]);
    let in_range = indices
        .last()
        .is_none_or(|&last| (last as usize) < dense_len);
    if !increasing || !in_range {
        return Err(Error::InvalidArgument(format!(
            "{op}: indices must be strictly increasing and below {dense_len}"
        )));
    }
    Ok(())
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
        check_host_list(OP, dense_len, indices, values.len())?;
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
