//! The half-precision strategy (SINGA's `backward_and_update_half`, done
//! right): f16 or bf16 on the wire, accumulated in f32 and rounded once,
//! optionally clamped first; blocking, on the communication thread
//! (`_async`), and [`HalfAverage`], a bucket's average as a [`Strategy`].

use crate::error::Result;
use crate::fault::prepare;
use crate::fusion::{FusionBuffers, all_on_cpu, check_capacity, host_f32_parts, pack, unpack};
use crate::handle::{Handle, Reduced, Traffic};
use crate::strategy::{BucketView, Combined, Strategy};
use gradwire_comm::{Communicator, ReduceOp};
use gradwire_compress::cast::{self, CastOptions};
use gradwire_tensor::{DType, Tensor, WithDType, flat};

/// The precision on the wire of [`half_all_reduce`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfPrecision {
    /// IEEE half precision (range 65504; use `Avg` or a clip for large sums).
    F16,
    /// bfloat16 (f32's range, 8 bits of mantissa).
    BF16,
}

/// Options of [`half_all_reduce`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HalfOptions {
    /// The wire precision.
    pub precision: HalfPrecision,
    /// Clamp every gradient to `[-clip, clip]` first (SINGA's clipping); the
    /// clamped values are what is reduced, and so what the update uses.
    pub clip: Option<f32>,
    /// `Sum` or `Avg`. The sum is accumulated in f32 either way and rounded
    /// once; `Avg` divides before that rounding, so an average of values that
    /// fit f16 cannot overflow (SINGA's fp16 sum overflowed past 65504).
    pub op: ReduceOp,
}

/// All-reduces a list of tensors with f16 or bf16 on the wire (SINGA's
/// `backward_and_update_half` collective), fused through one buffer of at
/// most `capacity` elements.
pub fn half_all_reduce<C: Communicator>(
    comm: &C,
    tensors: &mut [Tensor],
    options: &HalfOptions,
    capacity: usize,
) -> Result<Traffic> {
    half_all_reduce_with(
        comm,
        tensors,
        options,
        capacity,
        &mut FusionBuffers::default(),
    )
}

/// [`half_all_reduce`] through `buffers` (the wire buffer, and the f32
/// fusion buffer where tensors are not f32 in host memory), reused from
/// call to call: the same result, bit for bit.
/// CUDA tensors on a communicator that takes device tensors (NcclComm, with
/// the `cuda` feature) stay on the device: packed, encoded, reduced and
/// decoded there, in buffers kept in `buffers` too.
pub fn half_all_reduce_with<C: Communicator>(
    comm: &C,
    tensors: &mut [Tensor],
    options: &HalfOptions,
    capacity: usize,
    buffers: &mut FusionBuffers,
) -> Result<Traffic> {
    #[cfg(feature = "cuda")]
    if !all_on_cpu(tensors) && comm.takes_device_tensors() {
        return crate::device::half_all_reduce(
            comm,
            tensors,
            options,
            capacity,
            &mut buffers.device,
        );
    }
    let FusionBuffers { f32, f16, bf16, .. } = buffers;
    match options.precision {
        HalfPrecision::F16 => half_all_reduce_as(comm, tensors, options, capacity, f32, f16),
        HalfPrecision::BF16 => half_all_reduce_as(comm, tensors, options, capacity, f32, bf16),
    }
}

/// How a bucket's tensors meet the wire.
enum Staging {
    /// f32 tensors in host memory ([`host_f32_parts`]), each encoded
    /// straight into its range of the wire and decoded straight back (the
    /// cast is elementwise, so the bits are those of a packed buffer's,
    /// without its two copies).
    Direct,
    /// Other host tensors (or a zeroed one): packed into the f32 buffer,
    /// cast from there.
    Packed,
    /// Device tensors, copied out with this layout.
    Device(flat::FlatLayout),
}

/// [`half_all_reduce`] with `H` on the wire: every tensor encoded into
/// `wire` (f32 host tensors directly; others packed into `flat` as f32
/// first, device tensors copied out), all-reduced, decoded and unpacked.
fn half_all_reduce_as<C: Communicator, H: WithDType + gradwire_comm::Element>(
    comm: &C,
    tensors: &mut [Tensor],
    options: &HalfOptions,
    capacity: usize,
    flat_buf: &mut Vec<f32>,
    wire: &mut Vec<H>,
) -> Result<Traffic> {
    let cast_options = CastOptions {
        clip: options.clip,
        scale: 1.0,
    };
    let on_cpu = all_on_cpu(tensors);
    let (n, staging) = prepare(comm, || {
        let n = check_capacity(tensors, capacity)?;
        if wire.len() < n {
            wire.resize(n, H::zeroed());
        }
        if let Some(parts) = host_f32_parts(tensors) {
            let mut rest = &mut wire[..n];
            for part in parts {
                let (dst, tail) = rest.split_at_mut(part.len());
                cast::encode(part, dst, &cast_options)?;
                rest = tail;
            }
            if !rest.is_empty() {
                return Err(gradwire_tensor::Error::LengthMismatch {
                    op: "half_all_reduce",
                    expected: n,
                    got: n - rest.len(),
                }
                .into());
            }
            return Ok((n, Staging::Direct));
        }
        let staging = if on_cpu {
            flat::pack_into(tensors, flat_buf)?;
            Staging::Packed
        } else {
            let (buffer, layout) = pack(tensors, DType::F32)?;
            flat_buf.clear();
            flat_buf.extend_from_slice(buffer.as_slice::<f32>()?);
            Staging::Device(layout)
        };
        cast::encode(&flat_buf[..n], &mut wire[..n], &cast_options)?;
        Ok((n, staging))
    })?;
    comm.all_reduce(&mut wire[..n], options.op)?;
    match staging {
        Staging::Direct => {
            let mut rest = &wire[..n];
            for t in tensors.iter_mut() {
                let (part, tail) = rest.split_at(t.len());
                cast::decode(part, t.as_mut_slice::<f32>()?)?;
                rest = tail;
            }
        }
        Staging::Packed => {
            cast::decode(&wire[..n], &mut flat_buf[..n])?;
            flat::unpack_from(&flat_buf[..n], tensors)?;
        }
        Staging::Device(layout) => {
            cast::decode(&wire[..n], &mut flat_buf[..n])?;
            let buffer = Tensor::from_vec(flat_buf[..n].to_vec(), n)?;
            unpack(&buffer, &layout, tensors)?;
        }
    }
    Ok(Traffic::all_reduce(
        n * H::DTYPE.size_in_bytes(),
        comm.world_size(),
    ))
}

/// [`half_all_reduce`] on the communication thread.
pub fn half_all_reduce_async<C: Communicator>(
    comm: &C,
    mut tensors: Vec<Tensor>,
    options: HalfOptions,
    capacity: usize,
) -> Result<Handle<Vec<Tensor>>> {
    let pending = comm.run_async(move |comm| {
        Ok(
            half_all_reduce(comm, &mut tensors, &options, capacity).map(|traffic| Reduced {
                value: tensors,
                traffic,
            }),
        )
    })?;
    Ok(Handle::from_pending(pending))
}

/// The average of a bucket with half-precision wire buffers, reused from
/// step to step.
#[derive(Debug)]
pub struct HalfAverage {
    options: HalfOptions,
    fusion: FusionBuffers,
}

impl HalfAverage {
    /// `precision` on the wire; gradients clamped to `[-clip, clip]` first
    /// when `clip` is given.
    pub fn new(precision: HalfPrecision, clip: Option<f32>) -> Self {
        HalfAverage {
            options: HalfOptions {
                precision,
                clip,
                op: ReduceOp::Avg,
            },
            fusion: FusionBuffers::default(),
        }
    }
}

impl<C: Communicator + 'static> Strategy<C> for HalfAverage {
    fn combine(
        &mut self,
        comm: &C,
        bucket: &BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> Result<Combined> {
        let traffic = half_all_reduce_with(
            comm,
            tensors,
            &self.options,
            bucket.capacity,
            &mut self.fusion,
        )?;
        Ok(Combined {
            traffic,
            averaged: true,
        })
    }
}
