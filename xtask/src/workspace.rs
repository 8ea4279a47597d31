//! The workspace as xtask reads it: its members, their Rust files, and
//! the code of a file with comments and literals blanked out. Shared by
//! the tidy checks and by `cargo xtask test`, which finds the crates whose
//! code differs without features.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Directories never searched: build outputs and version control.
const SKIPPED_DIRS: &[&str] = &["target", ".git"];

/// The code of the Rust source `text`: comments (doc comments included)
/// removed, and string, byte string, raw string and char literals emptied,
/// so that words in them are not taken for code. Line breaks are kept.
pub(crate) fn code_of(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let at = |i: usize| chars.get(i).copied();
    let mut code = String::with_capacity(text.len());
    let mut i = 0;
    while let Some(c) = at(i) {
        if c == '/' && at(i + 1) == Some('/') {
            while at(i).is_some_and(|c| c != '\n') {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == Some('*') {
            let mut depth = 0_usize;
            while let Some(c) = at(i) {
                if c == '/' && at(i + 1) == Some('*') {
                    depth += 1;
                    i += 2;
                } else if c == '*' && at(i + 1) == Some('/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c == '\n' {
                        code.push('\n');
                    }
                    i += 1;
                }
            }
            code.push(' ');
        } else if let Some(hashes) = raw_string_at(&chars, i) {
            // r, the hashes, the quote; then up to a quote and as many hashes.
            i += hashes + 2;
            let closing: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            while i < chars.len() && !chars[i..].starts_with(&closing) {
                i += 1;
            }
            i += closing.len();
            code.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while let Some(c) = at(i) {
                i += if c == '\\' { 2 } else { 1 };
                if c == '"' {
                    break;
                }
            }
            code.push_str("\"\"");
        } else if c == '\'' && at(i + 1) == Some('\\') {
            // An escaped char literal: past the escaped character, then up
            // to the closing quote.
            i += 3;
            while at(i).is_some_and(|c| c != '\'') {
                i += 1;
            }
            i += 1;
            code.push_str("' '");
        } else if c == '\'' && at(i + 2) == Some('\'') {
            i += 3;
            code.push_str("' '");
        } else {
            // Code, a lifetime's quote included.
            code.push(c);
            i += 1;
        }
    }
    code
}

/// The number of `#`s of the raw string literal (`r"..."`, `r#"..."#`,
/// `br"..."`) that starts at `chars[i]`, if one does.
fn raw_string_at(chars: &[char], i: usize) -> Option<usize> {
    let before = |back: usize| i.checked_sub(back).map(|j| chars[j]);
    let starts_token = !before(1).is_some_and(is_ident_char)
        || (before(1) == Some('b') && !before(2).is_some_and(is_ident_char));
    if chars[i] != 'r' || !starts_token {
        return None;
    }
    let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
    (chars.get(i + 1 + hashes) == Some(&'"')).then_some(hashes)
}

/// Whether `c` may be part of a Rust identifier.
pub(crate) fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The member directories of the workspace at `root`, in manifest order, with
/// `dir/*` patterns expanded to the subdirectories that have a `Cargo.toml`.
pub(crate) fn workspace_members(root: &Path) -> Vec<PathBuf> {
    let manifest = read(&root.join("Cargo.toml"));
    let mut members = Vec::new();
    for pattern in member_patterns(&manifest) {
        match pattern.strip_suffix("/*") {
            Some(parent) => {
                let mut dirs: Vec<PathBuf> = read_dir(&root.join(parent))
                    .into_iter()
                    .filter(|dir| dir.join("Cargo.toml").is_file())
                    .collect();
                dirs.sort();
                members.extend(dirs);
            }
            None => members.push(root.join(pattern)),
        }
    }
    members
}

/// The strings of the `members = [...]` array of a workspace manifest.
pub(crate) fn member_patterns(manifest: &str) -> Vec<String> {
    let uncommented: Vec<&str> = manifest
        .lines()
        .map(|line| line.split('#').next().unwrap_or_default())
        .collect();
    let text = uncommented.join("\n");
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let is_members = line
            .trim_start()
            .strip_prefix("members")
            .is_some_and(|rest| rest.trim_start().starts_with('='));
        if is_members {
            let array = text[offset..]
                .split_once('[')
                .and_then(|(_, rest)| rest.split_once(']'))
                .map_or("", |(array, _)| array);
            return array
                .split('"')
                .skip(1)
                .step_by(2)
                .map(String::from)
                .collect();
        }
        offset += line.len();
    }
    Vec::new()
}

/// Appends every file under `dir` whose extension is one of `extensions`
/// (recursively, skipping [`SKIPPED_DIRS`]) to `files`. A missing `dir` has
/// none.
pub(crate) fn files_with_extensions(dir: &Path, extensions: &[&str], files: &mut Vec<PathBuf>) {
    for path in read_dir(dir) {
        if path.is_dir() {
            let skipped = path
                .file_name()
                .is_some_and(|name| SKIPPED_DIRS.iter().any(|s| name == *s));
            if !skipped {
                files_with_extensions(&path, extensions, files);
            }
        } else if path
            .extension()
            .is_some_and(|ext| extensions.iter().any(|e| ext == *e))
        {
            files.push(path);
        }
    }
}

/// Every file and folder under `root` (recursively, skipping
/// [`SKIPPED_DIRS`]), as paths relative to `root` joined by `/`, a folder's
/// with a trailing `/`, sorted. Tidy's, which only tests build.
#[cfg(test)]
pub(crate) fn repository_paths(root: &Path) -> Vec<String> {
    fn walk(dir: &Path, prefix: &str, paths: &mut Vec<String>) {
        for path in read_dir(dir) {
            let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
                continue;
            };
            if path.is_dir() {
                if !SKIPPED_DIRS.iter().any(|s| name == *s) {
                    let folder = format!("{prefix}{name}/");
                    walk(&path, &folder, paths);
                    paths.push(folder);
                }
            } else {
                paths.push(format!("{prefix}{name}"));
            }
        }
    }
    let mut paths = Vec::new();
    walk(root, "", &mut paths);
    paths.sort();
    paths
}

/// The entries of `dir`; none if it does not exist.
fn read_dir(dir: &Path) -> Vec<PathBuf> {
    match fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|entry| entry.expect("read directory entry").path())
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("cannot read {}: {e}", dir.display()),
    }
}

/// The contents of `file`, which must be UTF-8.
pub(crate) fn read(file: &Path) -> String {
    fs::read_to_string(file).unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()))
}

/// The name of the package whose manifest is `member/Cargo.toml` (the first
/// `name = "..."` line, which is its `[package]`'s).
pub(crate) fn package_name(member: &Path) -> Option<String> {
    read(&member.join("Cargo.toml")).lines().find_map(|line| {
        let value = line.trim().strip_prefix("name")?.trim_start();
        let value = value.strip_prefix('=')?.trim();
        Some(value.strip_prefix('"')?.strip_suffix('"')?.to_owned())
    })
}

/// The packages of the workspace at `root` whose own code (their `src/`)
/// differs when built without features: a `not(feature ...)` cfg in it,
/// comments and literals aside, other than a lint attribute's
/// (`cfg_attr(not(feature ...), allow(...))`).
pub(crate) fn packages_with_default_only_code(root: &Path) -> Vec<String> {
    workspace_members(root)
        .into_iter()
        .filter(|member| {
            let mut files = Vec::new();
            files_with_extensions(&member.join("src"), &["rs"], &mut files);
            files.iter().any(|file| {
                let code = code_of(&read(file)).replace("cfg_attr(not(feature", "");
                code.contains("not(feature")
            })
        })
        .filter_map(|member| package_name(&member))
        .collect()
}

/// The packages the workspace manifest `manifest` gives a profile setting
/// of their own (`[profile.<any>.package.<name>]`, the `"*"` of every
/// dependency aside), each once, in manifest order.
pub(crate) fn packages_with_profile_settings(manifest: &str) -> Vec<String> {
    let mut packages: Vec<String> = Vec::new();
    for line in manifest.lines() {
        let Some(header) = line.trim().strip_prefix("[profile.") else {
            continue;
        };
        let Some((_, package)) = header.split_once(".package.") else {
            continue;
        };
        let Some(package) = package.strip_suffix(']') else {
            continue;
        };
        let package = package.trim_matches('"');
        if package != "*" && !packages.iter().any(|p| p == package) {
            packages.push(package.to_owned());
        }
    }
    packages
}

#[cfg(test)]
mod tests {
    /// Every package a profile names, once; the `"*"` of the dependencies
    /// and other sections are not packages.
    #[test]
    fn profile_settings_name_their_packages_once() {
        let manifest = "[workspace]\nmembers = [\"a\"]\n\
            [profile.dev]\ndebug = 1\n\
            [profile.dev.package.\"*\"]\ndebug = false\n\
            [profile.dev.package.candle-core]\nopt-level = 1\n\
            [profile.test.package.candle-core]\nopt-level = 3\n\
            [profile.test.package.\"gemm-f32\"]\nopt-level = 3\n\
            [dependencies.profile]\n";
        assert_eq!(
            super::packages_with_profile_settings(manifest),
            ["candle-core", "gemm-f32"]
        );
        assert!(super::packages_with_profile_settings("").is_empty());
    }
}
