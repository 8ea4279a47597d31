//! The typed signature of a kernel: what each parameter is (a value of a C
//! type, or a pointer to elements of one, read or written), how many
//! elements the kernel may touch through each pointer (an [`Extent`]: a
//! function of the launch's integer arguments and grid), and which grids it
//! accepts.
//!
//! A signature is the contract between a kernel body and its launchers, as
//! an `extern "C"` declaration is in Rust, and more: gradwire-tensor's typed
//! launch checks every launch against it (each argument's kind, element
//! type and length, the grid) before anything is queued, which is what lets
//! the crates that launch kernels do so without `unsafe`. So signatures are
//! declared only here, beside the PTX ([`Kernel`] cannot be built
//! elsewhere), and this crate's tests check them against the PTX's own
//! parameter lists (count, order and width of every `.param`).

/// The C type of a kernel parameter, or of the elements a pointer points
/// to (`gw_u8`, `gw_u32`, `gw_u64`, `int`, `gw_f16`, `gw_bf16`, `float`,
/// `double` in `gradwire.cuh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CType {
    /// `gw_u8`.
    U8,
    /// `gw_u32`.
    U32,
    /// `gw_u64`.
    U64,
    /// `int`.
    I32,
    /// `gw_f16`, IEEE half precision.
    F16,
    /// `gw_bf16`, bfloat16.
    BF16,
    /// `float`.
    F32,
    /// `double`.
    F64,
}

impl CType {
    /// The size of one value in bytes.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            CType::U8 => 1,
            CType::F16 | CType::BF16 => 2,
            CType::U32 | CType::I32 | CType::F32 => 4,
            CType::U64 | CType::F64 => 8,
        }
    }

    /// The PTX type of a parameter passed by value (`int` and `gw_u32`
    /// are both `.u32`, as NVRTC declares them).
    pub const fn ptx_param(self) -> &'static str {
        match self {
            CType::U8 => ".u8",
            CType::U32 | CType::I32 => ".u32",
            CType::U64 => ".u64",
            CType::F16 | CType::BF16 => ".b16",
            CType::F32 => ".f32",
            CType::F64 => ".f64",
        }
    }
}

/// What an [`Extent`] may read: the launch's integer arguments by
/// parameter position, and its grid.
#[derive(Debug, Clone, Copy)]
pub struct LaunchShape<'a> {
    integers: &'a [Option<u64>],
    grid: (u32, u32),
}

impl<'a> LaunchShape<'a> {
    /// The shape of a launch whose parameter `i` is the integer
    /// `integers[i]` (`None` for a pointer or a float) on a grid of
    /// `grid.0 x grid.1` blocks.
    pub fn new(integers: &'a [Option<u64>], grid: (u32, u32)) -> LaunchShape<'a> {
        LaunchShape { integers, grid }
    }

    /// The integer argument at parameter position `i` (`None` when that
    /// parameter is not an integer).
    pub fn arg(&self, i: usize) -> Option<u64> {
        self.integers.get(i).copied().flatten()
    }

    /// The blocks of the grid in x.
    pub fn grid_x(&self) -> u64 {
        u64::from(self.grid.0)
    }
}

/// How many elements a kernel may touch through a pointer, given the
/// launch: `None` when that overflows, or cannot be computed (a stride of
/// zero), which refuses the launch.
pub type Extent = fn(&LaunchShape<'_>) -> Option<u64>;

/// How a kernel accesses the memory a pointer parameter points to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `const T*`: read only.
    Read,
    /// `T*`: written, and maybe read.
    Write,
}

/// One parameter of a kernel.
#[derive(Debug, Clone, Copy)]
pub enum Param {
    /// A value of this type.
    Value(CType),
    /// A pointer to elements of `elem`.
    Pointer {
        /// The element type.
        elem: CType,
        /// Read or written.
        access: Access,
        /// Whether the kernel accepts a null pointer here (an optional
        /// buffer it then leaves alone).
        nullable: bool,
        /// The elements the kernel may touch.
        extent: Extent,
    },
}

/// The grids a kernel accepts. Every kernel runs `BLOCK` threads per block
/// (`GW_BLOCK` in `gradwire.cuh`: the block algorithms trap otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grid {
    /// Any grid (grid-stride loops, per-block outputs sized by the grid).
    Any,
    /// Exactly one block (a single-block algorithm).
    OneBlock,
}

/// A kernel of a PTX module with its typed signature.
#[derive(Debug, Clone, Copy)]
pub struct Kernel {
    module: &'static str,
    name: &'static str,
    params: &'static [Param],
    grid: Grid,
}

impl Kernel {
    /// Declares `name` of `module`. Crate-private: a signature is trusted by
    /// the typed launch, so only this crate, whose tests check every one
    /// against its PTX, declares them.
    pub(crate) const fn new(
        module: &'static str,
        name: &'static str,
        params: &'static [Param],
        grid: Grid,
    ) -> Kernel {
        Kernel {
            module,
            name,
            params,
            grid,
        }
    }

    /// The PTX module (the source file's stem).
    pub fn module(&self) -> &'static str {
        self.module
    }

    /// The `.entry` name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The parameters, in order.
    pub fn params(&self) -> &'static [Param] {
        self.params
    }

    /// The grids it accepts.
    pub fn grid(&self) -> Grid {
        self.grid
    }
}

/// A value parameter.
pub(crate) const fn value(ty: CType) -> Param {
    Param::Value(ty)
}

/// A `const T*` parameter.
pub(crate) const fn read(elem: CType, extent: Extent) -> Param {
    Param::Pointer {
        elem,
        access: Access::Read,
        nullable: false,
        extent,
    }
}

/// A `T*` parameter.
pub(crate) const fn write(elem: CType, extent: Extent) -> Param {
    Param::Pointer {
        elem,
        access: Access::Write,
        nullable: false,
        extent,
    }
}

/// `param`, which may also be null.
pub(crate) const fn or_null(param: Param) -> Param {
    match param {
        Param::Pointer {
            elem,
            access,
            extent,
            ..
        } => Param::Pointer {
            elem,
            access,
            nullable: true,
            extent,
        },
        Param::Value(ty) => Param::Value(ty),
    }
}
