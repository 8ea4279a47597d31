//! gradwire-cli's integration tests, gathered into one test binary (one link
//! instead of one per file): each module is the file it was.

mod cli;
mod gpt;
#[cfg(feature = "mpi")]
mod shaped_network;

/// The `gradwire` binary as a user who chose no compute threads runs it:
/// the variables that would override its own share of the cores among
/// its ranks removed (`cargo xtask test` sets `RAYON_NUM_THREADS` for the
/// tests that train in their own process).
fn gradwire_command() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_gradwire"));
    command
        .env_remove("RAYON_NUM_THREADS")
        .env_remove("CANDLE_NUM_THREADS");
    command
}
