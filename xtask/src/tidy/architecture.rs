//! Tidy's rules for `ARCHITECTURE.md`: its size, its invariants, and the
//! backticked paths it names.

use super::*;

/// The rules `ARCHITECTURE.md` with contents `text` breaks.
pub(super) fn check_architecture(text: &str) -> Vec<&'static str> {
    let mut broken = Vec::new();
    if text.len() > ARCHITECTURE_MAX_BYTES {
        broken.push(RULE_ARCHITECTURE_SIZE);
    }
    if !text.lines().any(|line| line.starts_with(INVARIANT_MARKER)) {
        broken.push(RULE_ARCHITECTURE_INVARIANTS);
    }
    broken
}

/// The paths `ARCHITECTURE.md` with contents `text` names: outside its
/// fenced blocks, the backticked tokens holding a `/` (not a comment's
/// `//`) or ending in one of [`ARCHITECTURE_FILE_EXTENSIONS`] after a name,
/// without a pattern's `*`, `<`, `>`, `{` or `}`; each once, in order.
pub(super) fn architecture_paths(text: &str) -> Vec<String> {
    let mut prose = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    let mut named: Vec<String> = Vec::new();
    for (k, token) in prose.split('`').enumerate() {
        let is_path = k % 2 == 1
            && !token.is_empty()
            && !token.contains(char::is_whitespace)
            && !token.contains(['*', '<', '>', '{', '}'])
            && !token.starts_with("//")
            && (token.contains('/')
                || (!token.starts_with('.')
                    && ARCHITECTURE_FILE_EXTENSIONS
                        .iter()
                        .any(|ext| token.ends_with(ext))));
        if is_path && !named.iter().any(|n| n == token) {
            named.push(token.to_string());
        }
    }
    named
}

/// Whether the repository path `path` (a folder's with a trailing `/`) is
/// what `named` names: the same path, or one ending in `/` + `named`; a
/// folder named with or without its `/`.
pub(super) fn names_path(path: &str, named: &str) -> bool {
    let suffix = format!("/{named}");
    [path, path.strip_suffix('/').unwrap_or(path)]
        .iter()
        .any(|p| *p == named || p.ends_with(&suffix))
}
