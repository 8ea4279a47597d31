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

use cudarc::driver::{CudaSlice, CudaView, PushKernelArg};
use gradwire_kernels::select as k;

use crate::cuda_backend::CudaStorage;
use crate::cuda_backend::driver::CudaDevice;
use crate::cuda_backend::launch::{
    BLOCK, MAX_GRID, NO_INDEX, blocks, download, first_index_cell, grid_stride, launched, len_arg,
    read_first_index, require_f32, u32_arg, upload, zeros,
};
use crate::error::{Error, Result};

/// A selection on the device: keep every entry whose magnitude key is above
/// `key`, and the first `ties` (in index order) of those equal to it. Four
/// u64 in device memory (`key`, `ties`, and the radix select's working
/// values), so that selections are found and applied without a round trip.
#[derive(Debug)]
pub struct Selection {
    device: Arc<CudaDevice>,
    state: CudaSlice<u64>,
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
            state: upload(device, &[u64::from(key), NO_INDEX, 0, 0])?,
            ties_on_host: Some(NO_INDEX),
        })
    }

    /// Keeps every entry equal to the key instead of the first `ties` (the
    /// threshold of sampled top-k: the sample's order statistic).
    pub fn keep_all_ties(&mut self) -> Result<()> {
        let function = self.device.function(k::NAME, k::SELECTION_ALL_TIES)?;
        let mut args = self.device.stream().launch_builder(&function);
        args.arg(&mut self.state);
        #[allow(unsafe_code)]
        // SAFETY: selection_all_ties(u64* sel) writes sel[1] of the four-u64
        // state this selection owns.
        let result = unsafe { args.launch(blocks(1)) };
        launched(k::SELECTION_ALL_TIES, result)?;
        self.ties_on_host = Some(NO_INDEX);
        Ok(())
    }

    /// The selection's key and ties, on the host (waits for the stream).
    pub fn to_host(&self) -> Result<(u32, u64)> {
        let state = download(&self.device, &self.state, 2)?;
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
    indices: CudaSlice<u32>,
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

    /// The indices (the buffer may be longer than [`DeviceSparse::nnz`]:
    /// it holds at least one element).
    pub fn indices(&self) -> &CudaSlice<u32> {
        &self.indices
    }

    /// The values, an f32 storage of [`DeviceSparse::nnz`] elements.
    pub fn values(&self) -> &CudaStorage {
        &self.values
    }

    /// Indices and values on the host (waits for the stream).
    pub fn to_host(&self) -> Result<(Vec<u32>, Vec<f32>)> {
        let indices = download(self.values.device(), &self.indices, self.nnz)?;
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
    let device = Arc::clone(x.device());
    let mut first = first_index_cell(&device)?;
    let function = device.function(k::NAME, k::FIRST_NON_FINITE_F32)?;
    let n_arg = len_arg(n)?;
    let view = x.bytes()?;
    let mut args = device.stream().launch_builder(&function);
    args.arg(&view).arg(&n_arg).arg(&mut first);
    #[allow(unsafe_code)]
    // SAFETY: first_non_finite_f32(const float* x, u64 n, u64* first): `x`
    // holds n f32 (checked dtype), `first` one u64.
    let result = unsafe { args.launch(grid_stride(n)) };
    launched(k::FIRST_NON_FINITE_F32, result)?;
    read_first_index(&device, &first)
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
    let device = Arc::clone(x.device());
    let mut state = zeros::<u64>(&device, 4)?;
    let mut hist = zeros::<u64>(&device, 256)?;
    let stream = device.stream();
    let k_arg = len_arg(k_th)?;
    let n_arg = len_arg(n)?;
    {
        let function = device.function(k::NAME, k::RADIX_INIT)?;
        let mut args = stream.launch_builder(&function);
        args.arg(&mut state).arg(&mut hist).arg(&k_arg);
        #[allow(unsafe_code)]
        // SAFETY: radix_init(u64* state, u64* hist, u64 k): four u64 of
        // state and 256 of histogram, one block of BLOCK threads.
        let result = unsafe { args.launch(blocks(1)) };
        launched(k::RADIX_INIT, result)?;
    }
    let view = x.bytes()?;
    let histogram = device.function(k::NAME, k::RADIX_HISTOGRAM_F32)?;
    let select_digit = device.function(k::NAME, k::RADIX_SELECT_DIGIT)?;
    for shift in [24u32, 16, 8, 0] {
        let mut args = stream.launch_builder(&histogram);
        args.arg(&view)
            .arg(&n_arg)
            .arg(&state)
            .arg(&mut hist)
            .arg(&shift);
        #[allow(unsafe_code)]
        // SAFETY: radix_histogram_f32(const float* x, u64 n, const u64*
        // state, u64* hist, u32 shift): n f32 in `x`, the four-u64 state and
        // the 256-bin histogram; BLOCK threads per block as required.
        let result = unsafe { args.launch(grid_stride(n)) };
        launched(k::RADIX_HISTOGRAM_F32, result)?;
        let mut args = stream.launch_builder(&select_digit);
        args.arg(&mut state).arg(&mut hist).arg(&shift);
        #[allow(unsafe_code)]
        // SAFETY: radix_select_digit(u64* state, u64* hist, u32 shift) on
        // the same state and histogram, one block of BLOCK threads.
        let result = unsafe { args.launch(blocks(1)) };
        launched(k::RADIX_SELECT_DIGIT, result)?;
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
    let mut out = CudaStorage::alloc_zeros(m, crate::DType::F32, x.ordinal())?;
    if m == 0 {
        return Ok(out);
    }
    let device = Arc::clone(x.device());
    let function = device.function(k::NAME, k::SAMPLE_STRIDED_F32)?;
    let (n_arg, stride_arg) = (len_arg(n)?, len_arg(stride)?);
    {
        let view = x.bytes()?;
        let mut sample = out.bytes_mut()?;
        let mut args = device.stream().launch_builder(&function);
        args.arg(&view)
            .arg(&n_arg)
            .arg(&stride_arg)
            .arg(&mut sample);
        #[allow(unsafe_code)]
        // SAFETY: sample_strided_f32(const float* x, u64 n, u64 stride, float*
        // out) writes out[0..ceil(n / stride)), which `out` holds.
        let result = unsafe { args.launch(grid_stride(m)) };
        launched(k::SAMPLE_STRIDED_F32, result)?;
    }
    Ok(out)
}

/// The tile each block of the count and compact kernels handles: a multiple
/// of [`BLOCK`] giving at most [`MAX_GRID`] tiles, and the number of tiles.
fn tiling(n: usize) -> (usize, usize) {
    let block = BLOCK as usize;
    let tiles = n.div_ceil(block).clamp(1, MAX_GRID as usize);
    let tile = n.div_ceil(tiles).div_ceil(block).max(1) * block;
    (tile, n.div_ceil(tile).max(1))
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
            indices: zeros(device, 0)?,
            values: CudaStorage::alloc_zeros(0, crate::DType::F32, device.ordinal())?,
        })
    };
    if n == 0 {
        return empty(&device);
    }
    let stream = device.stream();
    let (tile, tiles) = tiling(n);
    let (n_arg, tile_arg, tiles_arg) = (len_arg(n)?, len_arg(tile)?, len_arg(tiles)?);
    let mut counts_gt = zeros::<u64>(&device, tiles)?;
    let mut counts_eq = zeros::<u64>(&device, tiles)?;
    let mut totals = zeros::<u64>(&device, 2)?;
    let view = x.bytes()?;
    {
        let function = device.function(k::NAME, k::SELECT_COUNT_F32)?;
        let mut args = stream.launch_builder(&function);
        args.arg(&view)
            .arg(&n_arg)
            .arg(&tile_arg)
            .arg(&selection.state)
            .arg(&mut counts_gt)
            .arg(&mut counts_eq)
            .arg(&mut totals);
        #[allow(unsafe_code)]
        // SAFETY: select_count_f32(const float* x, u64 n, u64 tile, const
        // u64* sel, u64* counts_gt, u64* counts_eq, u64* totals): block b
        // reads x[b tile, (b + 1) tile) ∩ [0, n) and writes counts[b] for
        // b < tiles = ceil(n / tile), which both count buffers hold; totals
        // holds two u64; BLOCK threads per block as required.
        let result = unsafe { args.launch(blocks(u32_arg("tiles", tiles)?)) };
        launched(k::SELECT_COUNT_F32, result)?;
    }
    let ties = selection.ties()?;
    let counted = download(&device, &totals, 2)?;
    let (above, equal) = match counted.as_slice() {
        [above, equal] => (*above, *equal),
        _ => return Err(Error::Cuda("select_count_f32 returned no totals".into())),
    };
    let nnz =
        usize::try_from(above.saturating_add(equal.min(ties))).map_err(|_| Error::ShapeOverflow)?;
    if nnz == 0 {
        return empty(&device);
    }
    let scan = device.function(k::NAME, k::EXCLUSIVE_SCAN_U64)?;
    let mut offsets_gt = zeros::<u64>(&device, tiles + 1)?;
    let mut offsets_eq = zeros::<u64>(&device, tiles + 1)?;
    for (counts, offsets) in [(&counts_gt, &mut offsets_gt), (&counts_eq, &mut offsets_eq)] {
        let mut args = stream.launch_builder(&scan);
        args.arg(counts).arg(&tiles_arg).arg(offsets);
        #[allow(unsafe_code)]
        // SAFETY: exclusive_scan_u64(const u64* in, u64 m, u64* out) reads
        // m = tiles counts and writes m + 1 offsets, which the buffers hold;
        // one block of BLOCK threads.
        let result = unsafe { args.launch(blocks(1)) };
        launched(k::EXCLUSIVE_SCAN_U64, result)?;
    }
    let mut indices = zeros::<u32>(&device, nnz)?;
    let mut values = CudaStorage::alloc_zeros(nnz, crate::DType::F32, device.ordinal())?;
    {
        let function = device.function(k::NAME, k::SELECT_COMPACT_F32)?;
        let null: u64 = 0;
        let src: Option<CudaView<'_, u32>> = src_index.map(|s| s.indices.slice(..));
        let mut out_values = values.bytes_mut()?;
        let mut args = stream.launch_builder(&function);
        args.arg(&view)
            .arg(&n_arg)
            .arg(&tile_arg)
            .arg(&selection.state)
            .arg(&offsets_gt)
            .arg(&offsets_eq);
        match &src {
            Some(src) => args.arg(src),
            None => args.arg(&null),
        };
        args.arg(&mut indices).arg(&mut out_values);
        #[allow(unsafe_code)]
        // SAFETY: select_compact_f32(const float* x, u64 n, u64 tile, const
        // u64* sel, const u64* offsets_gt, const u64* offsets_eq, const u32*
        // src_index, u32* out_index, float* out_value), with the same tiling
        // as the count; the offsets hold tiles + 1 entries; src_index is
        // null or holds n indices (checked); the outputs hold nnz = above +
        // min(equal, ties) entries, exactly what the kernel writes.
        let result = unsafe { args.launch(blocks(u32_arg("tiles", tiles)?)) };
        launched(k::SELECT_COMPACT_F32, result)?;
    }
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
            indices: upload(&device, indices)?,
            values,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let (tile, tiles) = tiling(n);
            assert_eq!(tile % BLOCK as usize, 0, "n={n}");
            assert!(tiles <= MAX_GRID as usize, "n={n}");
            assert!(tile * tiles >= n, "n={n}");
            assert!(tile * (tiles - 1) < n, "n={n}: an empty tile");
        }
    }
}
