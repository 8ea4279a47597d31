//! Candle's compute threads: how many each rank gets when several share a
//! machine, unless the user chose.

/// The environment variable that sets candle's compute threads (its
/// matrix products' and its element-wise pool's, which falls back to it).
pub const COMPUTE_THREADS_VAR: &str = "RAYON_NUM_THREADS";

/// Candle's own variable for its compute threads, which it reads before
/// [`COMPUTE_THREADS_VAR`].
pub(crate) const CANDLE_THREADS_VAR: &str = "CANDLE_NUM_THREADS";

/// Every variable that sets candle's compute threads: one set is the
/// user's choice, which a run keeps.
pub(crate) const CHOSEN_THREADS_VARS: [&str; 2] = [COMPUTE_THREADS_VAR, CANDLE_THREADS_VAR];

/// The value to give [`COMPUTE_THREADS_VAR`] before a run of `ranks` ranks
/// that share this machine's `cores` cores (threads of this process, or a
/// shaped network's processes), `get` reading the environment: the cores
/// shared out among the ranks, unless the user chose (that variable or
/// `CANDLE_NUM_THREADS` set); `None` where nothing is to be set (the user's
/// choice, or `ranks` not known here: a rank of a user's own `mpirun`).
///
/// Set for one rank too: candle 0.11 reads the variable at every matrix
/// product and, when it is unset, counts the physical cores by parsing
/// `/proc/cpuinfo` each time (a quarter of the CPU time of a 4-rank
/// training on LocalComm, measured with `perf`).
pub fn compute_threads_to_set(
    ranks: Option<usize>,
    cores: usize,
    get: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Option<String> {
    let ranks = ranks?;
    if CHOSEN_THREADS_VARS.iter().any(|name| get(name).is_some()) {
        return None;
    }
    Some(compute_threads_per_rank(ranks, cores).to_string())
}

/// Candle's compute threads for each of `ranks` ranks that one machine of
/// `cores` cores runs at once: the cores shared out, at least one, as
/// torchrun gives each of its processes one OpenMP thread. By default
/// candle takes every core in every process, and its element-wise pool,
/// shared by the in-process ranks, runs one operation at a time while its
/// idle workers spin: with two ranks on two cores the transformer's step
/// took twice as long.
pub(super) fn compute_threads_per_rank(ranks: usize, cores: usize) -> usize {
    (cores / ranks.max(1)).max(1)
}
