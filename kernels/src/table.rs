//! The signature of every kernel, one module per CUDA source (the names of
//! the `.entry` functions in upper case): the declarations the typed launch
//! checks each launch against. Each reads as its C prototype in
//! `kernels/cuda/`, with the elements each pointer may touch as a function
//! of the integer arguments (`s.arg(i)`: the argument at position `i`) and
//! the grid. This crate's tests check every one against its PTX.
//!
//! A kernel that indexes memory through values it reads from the device
//! (sparse indices, scanned offsets, tensor ranges) bounds those values
//! itself, by a length it is given: an index past it is ignored or clipped.

use crate::signature::CType::{BF16, F16, F32, F64, I32, U8, U32, U64};
use crate::signature::{CType, Grid, Kernel, LaunchShape, or_null, read, value, write};

/// Declares the kernels of one module: `NAME = "entry" as T [params] Grid;`,
/// where `T` is the element type the params may name as `T` (the dtype of a
/// family of kernels), and `ALL`, every kernel of the module.
macro_rules! kernels {
    ($module:literal; $($name:ident = $entry:literal as $t:ident $params:tt $grid:ident;)*) => {
        $(
            #[doc = concat!("`", $entry, "` of `kernels/cuda/", $module, ".cu`.")]
            pub const $name: Kernel = {
                #[allow(dead_code)]
                const T: CType = CType::$t;
                Kernel::new($module, $entry, &$params, Grid::$grid)
            };
        )*
        /// Every kernel of the module.
        pub const ALL: &[Kernel] = &[$($name),*];
    };
}

/// One element (a result cell).
fn one(_: &LaunchShape<'_>) -> Option<u64> {
    Some(1)
}

/// `a + b * c` of the arguments at those positions: a window of a matrix
/// at an element offset.
fn window(s: &LaunchShape<'_>, at: usize, b: usize, c: usize) -> Option<u64> {
    s.arg(at)?.checked_add(s.arg(b)?.checked_mul(s.arg(c)?)?)
}

/// The bytes of a quantized payload of `n` entries in chunks of 512, each
/// with a header of `header` bytes, `bits` per entry (gradwire-compress's
/// `Quantizer::encoded_len`).
fn payload(n: u64, header: u64, bits: u64) -> Option<u64> {
    let codes = n.checked_mul(bits)?.div_ceil(8);
    n.div_ceil(512).checked_mul(header)?.checked_add(codes)
}

/// AdaSum's pairwise rule per tensor range (`adasum.cu`).
pub mod adasum {
    use super::*;

    kernels! { "adasum";
        // (const float* a, const float* b, u64 n, const u64* ranges, u64 tensors,
        //  double* partials): partials per tensor and block column.
        ADASUM_PARTIALS_F32 = "adasum_partials_f32" as F32 [
            read(F32, |s| s.arg(2)), read(F32, |s| s.arg(2)), value(U64),
            read(U64, |s| s.arg(4)?.checked_mul(2)), value(U64),
            write(F64, |s| s.arg(4)?.checked_mul(3)?.checked_mul(s.grid_x())),
        ] Any;
        // (const double* partials, u64 tensors, u64 columns, double* sums)
        ADASUM_FINISH_F64 = "adasum_finish_f64" as F64 [
            read(F64, |s| s.arg(1)?.checked_mul(3)?.checked_mul(s.arg(2)?)), value(U64),
            value(U64), write(F64, |s| s.arg(1)?.checked_mul(3)),
        ] Any;
        // (float* a, const float* b, u64 n, const u64* ranges, u64 tensors,
        //  const double* sums)
        ADASUM_COMBINE_F32 = "adasum_combine_f32" as F32 [
            write(F32, |s| s.arg(2)), read(F32, |s| s.arg(2)), value(U64),
            read(U64, |s| s.arg(4)?.checked_mul(2)), value(U64),
            read(F64, |s| s.arg(4)?.checked_mul(3)),
        ] Any;
    }
}

/// Conversions between the float dtypes and the cast codec (`cast.cu`).
pub mod cast {
    use super::*;

    kernels! { "cast";
        // (const S* src, D* dst, u64 n)
        CAST_F32_F16 = "cast_f32_f16" as F32 [read(F32, |s| s.arg(2)), write(F16, |s| s.arg(2)), value(U64)] Any;
        CAST_F32_BF16 = "cast_f32_bf16" as F32 [read(F32, |s| s.arg(2)), write(BF16, |s| s.arg(2)), value(U64)] Any;
        CAST_F16_F32 = "cast_f16_f32" as F16 [read(F16, |s| s.arg(2)), write(F32, |s| s.arg(2)), value(U64)] Any;
        CAST_BF16_F32 = "cast_bf16_f32" as BF16 [read(BF16, |s| s.arg(2)), write(F32, |s| s.arg(2)), value(U64)] Any;
        CAST_F16_BF16 = "cast_f16_bf16" as F16 [read(F16, |s| s.arg(2)), write(BF16, |s| s.arg(2)), value(U64)] Any;
        CAST_BF16_F16 = "cast_bf16_f16" as BF16 [read(BF16, |s| s.arg(2)), write(F16, |s| s.arg(2)), value(U64)] Any;
        // (const float* src, D* dst, u64 n, int has_clip, float clip, float scale)
        ENCODE_F32_F16 = "encode_f32_f16" as F16 [
            read(F32, |s| s.arg(2)), write(T, |s| s.arg(2)), value(U64), value(I32), value(F32),
            value(F32),
        ] Any;
        ENCODE_F32_BF16 = "encode_f32_bf16" as BF16 [
            read(F32, |s| s.arg(2)), write(T, |s| s.arg(2)), value(U64), value(I32), value(F32),
            value(F32),
        ] Any;
    }
}

/// NcclComm's rank-ordered reduction of staged chunks (`comm.cu`).
pub mod comm {
    use super::*;

    /// `reduce_chunks_*`'s `op` for the sum, in rank order (`GW_OP_SUM`).
    pub const OP_SUM: u32 = 0;
    /// The sum divided by the number of chunks (`GW_OP_AVG`).
    pub const OP_AVG: u32 = 1;
    /// The maximum, a NaN winning (`GW_OP_MAX`).
    pub const OP_MAX: u32 = 2;
    /// The minimum, a NaN winning (`GW_OP_MIN`).
    pub const OP_MIN: u32 = 3;

    kernels! { "comm";
        // (T* out, const T* stage, u64 n, u32 world, u32 op): stage holds the
        // world chunks of n back to back.
        REDUCE_CHUNKS_F32 = "reduce_chunks_f32" as F32 [
            write(T, |s| s.arg(2)), read(T, |s| s.arg(2)?.checked_mul(s.arg(3)?)), value(U64),
            value(U32), value(U32),
        ] Any;
        REDUCE_CHUNKS_F16 = "reduce_chunks_f16" as F16 [
            write(T, |s| s.arg(2)), read(T, |s| s.arg(2)?.checked_mul(s.arg(3)?)), value(U64),
            value(U32), value(U32),
        ] Any;
        REDUCE_CHUNKS_BF16 = "reduce_chunks_bf16" as BF16 [
            write(T, |s| s.arg(2)), read(T, |s| s.arg(2)?.checked_mul(s.arg(3)?)), value(U64),
            value(U32), value(U32),
        ] Any;
    }
}

/// gradwire-tensor's elementwise operations (`elementwise.cu`).
pub mod elementwise {
    use super::*;

    /// Declares the six kernels of one dtype.
    macro_rules! elementwise {
        ($t:ident: $fill:ident $fill_name:literal, $axpy:ident $axpy_name:literal,
         $scale:ident $scale_name:literal, $add:ident $add_name:literal,
         $mul:ident $mul_name:literal, $clamp:ident $clamp_name:literal) => {
            kernels! { "elementwise";
                // (T* y, u64 n, float v)
                $fill = $fill_name as $t [write(T, |s| s.arg(1)), value(U64), value(F32)] Any;
                // (T* y, float a, const T* x, u64 n)
                $axpy = $axpy_name as $t [
                    write(T, |s| s.arg(3)), value(F32), read(T, |s| s.arg(3)), value(U64),
                ] Any;
                // (T* y, float a, u64 n)
                $scale = $scale_name as $t [write(T, |s| s.arg(2)), value(F32), value(U64)] Any;
                // (T* y, const T* x, u64 n)
                $add = $add_name as $t [write(T, |s| s.arg(2)), read(T, |s| s.arg(2)), value(U64)] Any;
                $mul = $mul_name as $t [write(T, |s| s.arg(2)), read(T, |s| s.arg(2)), value(U64)] Any;
                // (T* y, float c, u64 n)
                $clamp = $clamp_name as $t [write(T, |s| s.arg(2)), value(F32), value(U64)] Any;
            }
        };
    }

    mod f32 {
        use super::*;
        elementwise!(F32: FILL_F32 "fill_f32", AXPY_F32 "axpy_f32", SCALE_F32 "scale_f32",
            ADD_F32 "add_f32", MUL_F32 "mul_f32", CLAMP_F32 "clamp_f32");
    }
    mod f16 {
        use super::*;
        elementwise!(F16: FILL_F16 "fill_f16", AXPY_F16 "axpy_f16", SCALE_F16 "scale_f16",
            ADD_F16 "add_f16", MUL_F16 "mul_f16", CLAMP_F16 "clamp_f16");
    }
    mod bf16 {
        use super::*;
        elementwise!(BF16: FILL_BF16 "fill_bf16", AXPY_BF16 "axpy_bf16", SCALE_BF16 "scale_bf16",
            ADD_BF16 "add_bf16", MUL_BF16 "mul_bf16", CLAMP_BF16 "clamp_bf16");
    }

    pub use bf16::{ADD_BF16, AXPY_BF16, CLAMP_BF16, FILL_BF16, MUL_BF16, SCALE_BF16};
    pub use f16::{ADD_F16, AXPY_F16, CLAMP_F16, FILL_F16, MUL_F16, SCALE_F16};
    pub use f32::{ADD_F32, AXPY_F32, CLAMP_F32, FILL_F32, MUL_F32, SCALE_F32};

    /// Every kernel of the module.
    pub const ALL: &[&[Kernel]] = &[f32::ALL, f16::ALL, bf16::ALL];
}

/// Error feedback, its cast step and scatter-add (`feedback.cu`).
pub mod feedback {
    use super::*;

    kernels! { "feedback";
        // (float* residual, const float* grad, u64 n, u64* first_bad)
        EF_ACCUMULATE_F32 = "ef_accumulate_f32" as F32 [
            write(F32, |s| s.arg(2)), read(F32, |s| s.arg(2)), value(U64), write(U64, one),
        ] Any;
        // (float* residual, float* velocity, const float* grad, u64 n, float mu,
        //  u64* first_bad)
        EF_ACCUMULATE_MOMENTUM_F32 = "ef_accumulate_momentum_f32" as F32 [
            write(F32, |s| s.arg(3)), write(F32, |s| s.arg(3)), read(F32, |s| s.arg(3)),
            value(U64), value(F32), write(U64, one),
        ] Any;
        // (float* residual, float* velocity, u64 n, const u32* index, u64 count):
        // an index >= n is ignored.
        EF_ZERO_SELECTED = "ef_zero_selected" as F32 [
            write(F32, |s| s.arg(2)), or_null(write(F32, |s| s.arg(2))), value(U64),
            read(U32, |s| s.arg(4)), value(U64),
        ] Any;
        // (float* residual, D* dst, u64 n, int has_clip, float clip, float scale,
        //  float inverse)
        EF_CAST_F32_F16 = "ef_cast_f32_f16" as F16 [
            write(F32, |s| s.arg(2)), write(T, |s| s.arg(2)), value(U64), value(I32), value(F32),
            value(F32), value(F32),
        ] Any;
        EF_CAST_F32_BF16 = "ef_cast_f32_bf16" as BF16 [
            write(F32, |s| s.arg(2)), write(T, |s| s.arg(2)), value(U64), value(I32), value(F32),
            value(F32), value(F32),
        ] Any;
        // (float* dense, u64 n, const u32* index, const V* value, u64 count): an
        // index >= n is ignored.
        SCATTER_ADD_F32 = "scatter_add_f32" as F32 [
            write(F32, |s| s.arg(1)), value(U64), read(U32, |s| s.arg(4)), read(T, |s| s.arg(4)),
            value(U64),
        ] Any;
        SCATTER_ADD_F16 = "scatter_add_f16" as F16 [
            write(F32, |s| s.arg(1)), value(U64), read(U32, |s| s.arg(4)), read(T, |s| s.arg(4)),
            value(U64),
        ] Any;
        SCATTER_ADD_BF16 = "scatter_add_bf16" as BF16 [
            write(F32, |s| s.arg(1)), value(U64), read(U32, |s| s.arg(4)), read(T, |s| s.arg(4)),
            value(U64),
        ] Any;
    }
}

/// PowerSGD's low-rank products (`lowrank.cu`): each matrix a window of its
/// buffer at an element offset.
pub mod lowrank {
    use super::*;

    kernels! { "lowrank";
        // (const float* m, u64 m_at, const float* qt, u64 qt_at, float* p, u64 p_at,
        //  u64 rows, u64 cols, u64 rank, u64 slots)
        LOWRANK_PROJECT_F32 = "lowrank_project_f32" as F32 [
            read(F32, |s| window(s, 1, 6, 7)), value(U64), read(F32, |s| window(s, 3, 8, 7)),
            value(U64), write(F32, |s| window(s, 5, 6, 8)), value(U64), value(U64), value(U64),
            value(U64), value(U64),
        ] Any;
        // (const float* m, u64 m_at, const float* p, u64 p_at, float* qt, u64 qt_at,
        //  u64 rows, u64 cols, u64 rank, u64 slots)
        LOWRANK_PROJECT_BACK_F32 = "lowrank_project_back_f32" as F32 [
            read(F32, |s| window(s, 1, 6, 7)), value(U64), read(F32, |s| window(s, 3, 6, 8)),
            value(U64), write(F32, |s| window(s, 5, 8, 7)), value(U64), value(U64), value(U64),
            value(U64), value(U64),
        ] Any;
        // (const float* p, u64 p_at, const float* qt, u64 qt_at, float* out,
        //  u64 out_at, u64 rows, u64 cols, u64 rank)
        LOWRANK_RECONSTRUCT_F32 = "lowrank_reconstruct_f32" as F32 [
            read(F32, |s| window(s, 1, 6, 8)), value(U64), read(F32, |s| window(s, 3, 8, 7)),
            value(U64), write(F32, |s| window(s, 5, 6, 7)), value(U64), value(U64), value(U64),
            value(U64),
        ] Any;
        // (float* p, u64 p_at, u64 rows, u64 rank)
        LOWRANK_ORTHONORMALIZE_F32 = "lowrank_orthonormalize_f32" as F32 [
            write(F32, |s| window(s, 1, 2, 3)), value(U64), value(U64), value(U64),
        ] OneBlock;
    }
}

/// The optimizer updates (`optim.cu`): parameters and gradients of the
/// kernel's dtype, f32 state.
pub mod optim {
    use super::*;

    /// Declares the five rules of one dtype.
    macro_rules! rules {
        ($t:ident: $sgd:ident $sgd_name:literal, $rmsprop:ident $rmsprop_name:literal,
         $adagrad:ident $adagrad_name:literal, $adam:ident $adam_name:literal,
         $adamw:ident $adamw_name:literal) => {
            kernels! { "optim";
                // (T* p, const T* g, float* buf, u64 n, float lr, float momentum,
                //  float dampening, float weight_decay, int nesterov): buf null
                //  without momentum.
                $sgd = $sgd_name as $t [
                    write(T, |s| s.arg(3)), read(T, |s| s.arg(3)), or_null(write(F32, |s| s.arg(3))),
                    value(U64), value(F32), value(F32), value(F32), value(F32), value(I32),
                ] Any;
                // (T* p, const T* g, float* square_avg, u64 n, float lr, float rho,
                //  float eps, float weight_decay)
                $rmsprop = $rmsprop_name as $t [
                    write(T, |s| s.arg(3)), read(T, |s| s.arg(3)), write(F32, |s| s.arg(3)),
                    value(U64), value(F32), value(F32), value(F32), value(F32),
                ] Any;
                // (T* p, const T* g, float* sum_sq, u64 n, float lr, float eps,
                //  float weight_decay)
                $adagrad = $adagrad_name as $t [
                    write(T, |s| s.arg(3)), read(T, |s| s.arg(3)), write(F32, |s| s.arg(3)),
                    value(U64), value(F32), value(F32), value(F32),
                ] Any;
                // (T* p, const T* g, float* m, float* v, u64 n, float step_size,
                //  float inv_c2, float beta1, float beta2, float eps, float l2)
                $adam = $adam_name as $t [
                    write(T, |s| s.arg(4)), read(T, |s| s.arg(4)), write(F32, |s| s.arg(4)),
                    write(F32, |s| s.arg(4)), value(U64), value(F32), value(F32), value(F32),
                    value(F32), value(F32), value(F32),
                ] Any;
                // (T* p, const T* g, float* m, float* v, u64 n, int apply_shrink,
                //  float shrink, float step_size, float inv_c2, float beta1,
                //  float beta2, float eps)
                $adamw = $adamw_name as $t [
                    write(T, |s| s.arg(4)), read(T, |s| s.arg(4)), write(F32, |s| s.arg(4)),
                    write(F32, |s| s.arg(4)), value(U64), value(I32), value(F32), value(F32),
                    value(F32), value(F32), value(F32), value(F32),
                ] Any;
            }
        };
    }

    mod f32 {
        use super::*;
        rules!(F32: SGD_F32 "sgd_f32", RMSPROP_F32 "rmsprop_f32", ADAGRAD_F32 "adagrad_f32",
            ADAM_F32 "adam_f32", ADAMW_F32 "adamw_f32");
    }
    mod f16 {
        use super::*;
        rules!(F16: SGD_F16 "sgd_f16", RMSPROP_F16 "rmsprop_f16", ADAGRAD_F16 "adagrad_f16",
            ADAM_F16 "adam_f16", ADAMW_F16 "adamw_f16");
    }
    mod bf16 {
        use super::*;
        rules!(BF16: SGD_BF16 "sgd_bf16", RMSPROP_BF16 "rmsprop_bf16",
            ADAGRAD_BF16 "adagrad_bf16", ADAM_BF16 "adam_bf16", ADAMW_BF16 "adamw_bf16");
    }

    pub use bf16::{ADAGRAD_BF16, ADAM_BF16, ADAMW_BF16, RMSPROP_BF16, SGD_BF16};
    pub use f16::{ADAGRAD_F16, ADAM_F16, ADAMW_F16, RMSPROP_F16, SGD_F16};
    pub use f32::{ADAGRAD_F32, ADAM_F32, ADAMW_F32, RMSPROP_F32, SGD_F32};

    /// Every kernel of the module.
    pub const ALL: &[&[Kernel]] = &[f32::ALL, f16::ALL, bf16::ALL];
}

/// The quantizers (`quant.cu`): payloads of chunks of 512 entries.
pub mod quant {
    use super::*;

    /// A 1-bit sign payload: a 4-byte scale per chunk, 8 entries a byte.
    fn sign(s: &LaunchShape<'_>) -> Option<u64> {
        payload(s.arg(1)?, 4, 1)
    }

    /// The most QSGD levels whose codes are nibbles: quant.cu's
    /// `GW_QSGD_NIBBLE_LEVELS`, gradwire-compress' `QSGD_NIBBLE_LEVELS`
    /// (the host suite's settings of 7 and 8 levels pin the three alike).
    const QSGD_NIBBLE_LEVELS: u64 = 7;

    /// A QSGD payload: a 4-byte scale per chunk, a nibble per entry up to
    /// [`QSGD_NIBBLE_LEVELS`] levels (argument 2 of each QSGD kernel), else
    /// a byte.
    fn qsgd(s: &LaunchShape<'_>) -> Option<u64> {
        let bits = if s.arg(2)? <= QSGD_NIBBLE_LEVELS {
            4
        } else {
            8
        };
        payload(s.arg(1)?, 4, bits)
    }

    /// An E3M0 payload: a 4-byte scale per chunk, a nibble per entry.
    fn e3m0(s: &LaunchShape<'_>) -> Option<u64> {
        payload(s.arg(1)?, 4, 4)
    }

    /// A min-max payload: 8 header bytes per chunk, a byte per entry.
    fn minmax(s: &LaunchShape<'_>) -> Option<u64> {
        payload(s.arg(1)?, 8, 8)
    }

    kernels! { "quant";
        // (const float* x, u64 n, u8* payload)
        QUANT_SIGN_ENCODE_F32 = "quant_sign_encode_f32" as F32 [
            read(F32, |s| s.arg(1)), value(U64), write(U8, sign),
        ] Any;
        // (const float* x, u64 n, u32 levels, u32 max_norm, u64 key, u8* payload)
        QUANT_QSGD_ENCODE_F32 = "quant_qsgd_encode_f32" as F32 [
            read(F32, |s| s.arg(1)), value(U64), value(U32), value(U32), value(U64),
            write(U8, qsgd),
        ] Any;
        // (const float* x, u64 n, u64 key, u8* payload)
        QUANT_E3M0_ENCODE_F32 = "quant_e3m0_encode_f32" as F32 [
            read(F32, |s| s.arg(1)), value(U64), value(U64), write(U8, e3m0),
        ] Any;
        QUANT_MINMAX_ENCODE_F32 = "quant_minmax_encode_f32" as F32 [
            read(F32, |s| s.arg(1)), value(U64), write(U8, minmax),
        ] Any;
        // (const u8* payload, u64 n, [u32 levels,] u64* first_bad)
        QUANT_SIGN_CHECK = "quant_sign_check" as U8 [read(U8, sign), value(U64), write(U64, one)] Any;
        QUANT_QSGD_CHECK = "quant_qsgd_check" as U8 [
            read(U8, qsgd), value(U64), value(U32), write(U64, one),
        ] Any;
        QUANT_E3M0_CHECK = "quant_e3m0_check" as U8 [
            read(U8, e3m0), value(U64), write(U64, one),
        ] Any;
        QUANT_MINMAX_CHECK = "quant_minmax_check" as U8 [
            read(U8, minmax), value(U64), write(U64, one),
        ] Any;
        // (const u8* payload, u64 n, [u32 levels,] float* out, int add)
        QUANT_SIGN_DECODE_F32 = "quant_sign_decode_f32" as F32 [
            read(U8, sign), value(U64), write(F32, |s| s.arg(1)), value(I32),
        ] Any;
        QUANT_QSGD_DECODE_F32 = "quant_qsgd_decode_f32" as F32 [
            read(U8, qsgd), value(U64), value(U32), write(F32, |s| s.arg(1)), value(I32),
        ] Any;
        QUANT_E3M0_DECODE_F32 = "quant_e3m0_decode_f32" as F32 [
            read(U8, e3m0), value(U64), write(F32, |s| s.arg(1)), value(I32),
        ] Any;
        QUANT_MINMAX_DECODE_F32 = "quant_minmax_decode_f32" as F32 [
            read(U8, minmax), value(U64), write(F32, |s| s.arg(1)), value(I32),
        ] Any;
    }
}

/// gradwire-tensor's reductions (`reduce.cu`).
pub mod reduce {
    use super::*;

    /// Declares the four reductions of one dtype.
    macro_rules! reductions {
        ($t:ident: $sum:ident $sum_name:literal, $sum_sq:ident $sum_sq_name:literal,
         $dot:ident $dot_name:literal, $max:ident $max_name:literal) => {
            kernels! { "reduce";
                // (const T* x, u64 n, double* partials): one partial per block.
                $sum = $sum_name as $t [read(T, |s| s.arg(1)), value(U64), write(F64, |s| Some(s.grid_x()))] Any;
                $sum_sq = $sum_sq_name as $t [read(T, |s| s.arg(1)), value(U64), write(F64, |s| Some(s.grid_x()))] Any;
                // (const T* a, const T* b, u64 n, double* partials)
                $dot = $dot_name as $t [
                    read(T, |s| s.arg(2)), read(T, |s| s.arg(2)), value(U64),
                    write(F64, |s| Some(s.grid_x())),
                ] Any;
                // (const T* x, u64 n, u32* out_key)
                $max = $max_name as $t [read(T, |s| s.arg(1)), value(U64), write(U32, one)] Any;
            }
        };
    }

    mod f32 {
        use super::*;
        reductions!(F32: SUM_PARTIAL_F32 "sum_partial_f32", SUM_SQ_PARTIAL_F32 "sum_sq_partial_f32",
            DOT_PARTIAL_F32 "dot_partial_f32", MAX_ABS_KEY_F32 "max_abs_key_f32");
    }
    mod f16 {
        use super::*;
        reductions!(F16: SUM_PARTIAL_F16 "sum_partial_f16", SUM_SQ_PARTIAL_F16 "sum_sq_partial_f16",
            DOT_PARTIAL_F16 "dot_partial_f16", MAX_ABS_KEY_F16 "max_abs_key_f16");
    }
    mod bf16 {
        use super::*;
        reductions!(BF16: SUM_PARTIAL_BF16 "sum_partial_bf16",
            SUM_SQ_PARTIAL_BF16 "sum_sq_partial_bf16", DOT_PARTIAL_BF16 "dot_partial_bf16",
            MAX_ABS_KEY_BF16 "max_abs_key_bf16");
    }
    mod finish {
        use super::*;
        kernels! { "reduce";
            // (const double* partials, u64 count, double* out)
            FINISH_SUM_F64 = "finish_sum_f64" as F64 [read(F64, |s| s.arg(1)), value(U64), write(F64, one)] OneBlock;
        }
    }

    pub use bf16::{DOT_PARTIAL_BF16, MAX_ABS_KEY_BF16, SUM_PARTIAL_BF16, SUM_SQ_PARTIAL_BF16};
    pub use f16::{DOT_PARTIAL_F16, MAX_ABS_KEY_F16, SUM_PARTIAL_F16, SUM_SQ_PARTIAL_F16};
    pub use f32::{DOT_PARTIAL_F32, MAX_ABS_KEY_F32, SUM_PARTIAL_F32, SUM_SQ_PARTIAL_F32};
    pub use finish::FINISH_SUM_F64;

    /// Every kernel of the module.
    pub const ALL: &[&[Kernel]] = &[f32::ALL, f16::ALL, bf16::ALL, finish::ALL];
}

/// Sparse selection (`select.cu`): a selection's state is four u64, a radix
/// histogram 256.
pub mod select {
    use super::*;

    kernels! { "select";
        // (const float* x, u64 n, u64* first)
        FIRST_NON_FINITE_F32 = "first_non_finite_f32" as F32 [
            read(F32, |s| s.arg(1)), value(U64), write(U64, one),
        ] Any;
        // (u64* state, u64* hist, u64 k)
        RADIX_INIT = "radix_init" as U64 [write(U64, |_| Some(4)), write(U64, |_| Some(256)), value(U64)] OneBlock;
        // (const float* x, u64 n, const u64* state, u64* hist, u32 shift)
        RADIX_HISTOGRAM_F32 = "radix_histogram_f32" as F32 [
            read(F32, |s| s.arg(1)), value(U64), read(U64, |_| Some(4)), write(U64, |_| Some(256)),
            value(U32),
        ] Any;
        // (u64* state, u64* hist, u32 shift)
        RADIX_SELECT_DIGIT = "radix_select_digit" as U64 [
            write(U64, |_| Some(4)), write(U64, |_| Some(256)), value(U32),
        ] OneBlock;
        // (u64* sel)
        SELECTION_ALL_TIES = "selection_all_ties" as U64 [write(U64, |_| Some(4))] OneBlock;
        // (const float* x, u64 n, u64 stride, float* out): out[0..ceil(n / stride)).
        SAMPLE_STRIDED_F32 = "sample_strided_f32" as F32 [
            read(F32, |s| s.arg(1)), value(U64), value(U64),
            write(F32, |s| {
                let (n, stride) = (s.arg(1)?, s.arg(2)?);
                (stride != 0).then(|| n.div_ceil(stride))
            }),
        ] Any;
        // (const float* x, u64 n, u64 tile, const u64* sel, u64* counts_gt,
        //  u64* counts_eq, u64* totals): one count per block.
        SELECT_COUNT_F32 = "select_count_f32" as F32 [
            read(F32, |s| s.arg(1)), value(U64), value(U64), read(U64, |_| Some(4)),
            write(U64, |s| Some(s.grid_x())), write(U64, |s| Some(s.grid_x())),
            write(U64, |_| Some(2)),
        ] Any;
        // (const u64* in, u64 m, u64* out): m + 1 offsets.
        EXCLUSIVE_SCAN_U64 = "exclusive_scan_u64" as U64 [
            read(U64, |s| s.arg(1)), value(U64), write(U64, |s| s.arg(1)?.checked_add(1)),
        ] OneBlock;
        // (const float* x, u64 n, u64 tile, const u64* sel, const u64* offsets_gt,
        //  const u64* offsets_eq, const u32* src_index, u32* out_index,
        //  float* out_value, u64 cap): an entry at or past cap is not written.
        SELECT_COMPACT_F32 = "select_compact_f32" as F32 [
            read(F32, |s| s.arg(1)), value(U64), value(U64), read(U64, |_| Some(4)),
            read(U64, |s| Some(s.grid_x())), read(U64, |s| Some(s.grid_x())),
            or_null(read(U32, |s| s.arg(1))), write(U32, |s| s.arg(9)), write(F32, |s| s.arg(9)),
            value(U64),
        ] Any;
    }
}

/// Every kernel of every module.
pub const ALL: &[&[Kernel]] = &[
    adasum::ALL,
    cast::ALL,
    comm::ALL,
    elementwise::ALL[0],
    elementwise::ALL[1],
    elementwise::ALL[2],
    feedback::ALL,
    lowrank::ALL,
    optim::ALL[0],
    optim::ALL[1],
    optim::ALL[2],
    quant::ALL,
    reduce::ALL[0],
    reduce::ALL[1],
    reduce::ALL[2],
    reduce::ALL[3],
    select::ALL,
];
