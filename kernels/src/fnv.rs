//! FNV-1a 64, the hash of the kernel manifest (`kernels/ptx/manifest.txt`).
//!
//! `cargo xtask ptx` records the hash of every CUDA source and PTX file with
//! it, and this crate's freshness test recomputes them. xtask cannot depend
//! on a crate, so it compiles this very file as a module of its own
//! (`#[path]`): the two sides cannot drift apart.

/// The FNV-1a 64-bit hash of `bytes` (offset basis `0xcbf29ce484222325`,
/// prime `0x100000001b3`).
pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::fnv1a_64;

    #[test]
    fn known_vectors() {
        // The reference values of the FNV specification's test suite.
        assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_64(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
