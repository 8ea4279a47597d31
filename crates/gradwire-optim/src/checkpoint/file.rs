//! Checkpoint files on disk: written atomically (a temporary file synced
//! and renamed over the old one), read back and validated.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

use super::format::to_bytes;
use super::read::from_bytes_with;
use super::{Checkpoint, LoadOptions};
use crate::error::{OptimError, Result};

/// Writes `ckpt` to `path` atomically: the file at `path` is either the
/// previous one or the complete new one, whatever fails or crashes.
///
/// Errors: those of [`to_bytes`], and [`OptimError::Io`] if writing, syncing
/// or renaming fails (the previous file is then untouched and the temporary
/// file removed).
pub fn save(path: impl AsRef<Path>, ckpt: &Checkpoint) -> Result<()> {
    let bytes = to_bytes(ckpt)?;
    save_bytes_with(path, |file| file.write_all(&bytes))
}

/// The atomic write of [`save`], with the writing of the contents left to
/// `write` (the CLI's timeline file is written with it; tests use it to
/// simulate a write failing halfway).
///
/// Creates a temporary file next to `path`, calls `write` on it, syncs it,
/// renames it to `path` and syncs the directory. If any step fails the
/// temporary file is removed and `path` is left as it was.
#[doc(hidden)]
pub fn save_bytes_with<F: FnOnce(&mut File) -> io::Result<()>>(
    path: impl AsRef<Path>,
    write: F,
) -> Result<()> {
    let path = path.as_ref();
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut builder = tempfile::Builder::new();
    builder.prefix(".gradwire-checkpoint-").suffix(".tmp");
    // The temporary file becomes the checkpoint: give it the permissions a
    // plain `File::create` would (0666 minus the umask), not tempfile's 0600.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    // On every early return below, dropping `tmp` deletes the temporary file.
    let mut tmp = builder.tempfile_in(dir)?;
    write(tmp.as_file_mut())?;
    tmp.as_file_mut().flush()?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| OptimError::Io(e.error))?;
    // Make the rename durable: a failing directory sync is an error (the
    // new file may not survive a crash). Only where a directory cannot be
    // opened as a file at all (Windows) is there nothing to sync.
    #[cfg(unix)]
    File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    if let Ok(d) = File::open(dir) {
        d.sync_all()?;
    }
    Ok(())
}

/// Reads and validates the checkpoint at `path`.
///
/// Errors: [`OptimError::Io`] if it cannot be read, and those of
/// [`from_bytes`](super::from_bytes).
pub fn load(path: impl AsRef<Path>) -> Result<Checkpoint> {
    load_with(path, &LoadOptions::default())
}

/// [`load`] with `options`.
pub fn load_with(path: impl AsRef<Path>, options: &LoadOptions) -> Result<Checkpoint> {
    let bytes = std::fs::read(path)?;
    from_bytes_with(&bytes, options)
}
