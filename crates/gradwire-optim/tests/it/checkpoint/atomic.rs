//! Saving to disk: a save replaces the file atomically, so an interrupted
//! write or a failed rename leaves the previous checkpoint and no temporary.

use std::io::{self, Write};
use std::path::Path;

use gradwire_optim::OptimError;
use gradwire_optim::checkpoint::{save, save_bytes_with, to_bytes};

use super::{load, rich, small};

#[test]
fn save_and_load_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt.safetensors");
    save(&path, &rich()).unwrap();
    assert_eq!(load(&path).unwrap(), rich());
    // Overwriting replaces the file.
    save(&path, &small()).unwrap();
    assert_eq!(load(&path).unwrap(), small());
    assert_eq!(std::fs::read(&path).unwrap(), to_bytes(&small()).unwrap());
    assert_eq!(dir_entries(dir.path()), vec!["ckpt.safetensors".to_owned()]);
    // A missing file is an I/O error.
    assert!(matches!(
        load(dir.path().join("missing")),
        Err(OptimError::Io(_))
    ));
}

#[test]
fn save_to_a_bare_file_name() {
    // `Path::parent` of a bare file name is "", which must mean ".". The
    // current directory is process-wide, but no other test uses relative
    // paths.
    let dir = tempfile::tempdir().unwrap();
    let old = std::env::current_dir().unwrap();
    std::env::set_current_dir(dir.path()).unwrap();
    let saved = save("ckpt", &small());
    let loaded = load("ckpt");
    std::env::set_current_dir(old).unwrap();
    saved.unwrap();
    assert_eq!(loaded.unwrap(), small());
    assert_eq!(dir_entries(dir.path()), vec!["ckpt".to_owned()]);
}

fn dir_entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn interrupted_save_leaves_the_previous_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt");
    save(&path, &small()).unwrap();
    let b = to_bytes(&rich()).unwrap();
    let err = save_bytes_with(&path, |f| {
        f.write_all(&b[..b.len() / 2])?;
        Err(io::Error::other("simulated crash halfway"))
    })
    .unwrap_err();
    assert!(matches!(err, OptimError::Io(ref e) if e.to_string().contains("simulated")));
    assert_eq!(load(&path).unwrap(), small());
    assert_eq!(dir_entries(dir.path()), vec!["ckpt".to_owned()]);

    // The writer succeeding makes the save happen.
    save_bytes_with(&path, |f| f.write_all(&b)).unwrap();
    assert_eq!(load(&path).unwrap(), rich());
    assert_eq!(dir_entries(dir.path()), vec!["ckpt".to_owned()]);
}

#[test]
fn failing_rename_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    // A non-empty directory where the file should go: the rename fails.
    let path = dir.path().join("taken");
    std::fs::create_dir(&path).unwrap();
    std::fs::write(path.join("inside"), b"x").unwrap();
    assert!(matches!(save(&path, &small()), Err(OptimError::Io(_))));
    assert_eq!(dir_entries(dir.path()), vec!["taken".to_owned()]);
    // A missing parent directory.
    let missing = dir.path().join("no/such/dir/ckpt");
    assert!(matches!(save(&missing, &small()), Err(OptimError::Io(_))));
}
