//! The line a GPU test prints when it skips its GPU part, and its parser.
//!
//! `testing::device_or_skip` and gradwire-tests' NCCL gate write it
//! straight to stderr, past the test harness's capture, so it shows in a
//! log; `cargo xtask test` counts these lines in its test step's output, per
//! package, and prints the count at its end. xtask cannot depend on a crate,
//! so it compiles this very file as a module of its own (`#[path]`): the
//! writer and the counter cannot drift apart. Only `std`.

/// How every skip line starts.
pub const PREFIX: &str = "SKIP GPU ";

/// What comes between the test's name and the reason.
const DID_NOT_RUN: &str = " did not run its GPU part: ";

/// The skip line of the test `test` of the package `package`, which skipped
/// because of `why`, newline included:
/// `SKIP GPU <package>: <test> did not run its GPU part: <why>` (line breaks
/// in `why` become spaces, so it stays one line).
pub fn format(package: &str, test: &str, why: &str) -> String {
    let why = why.replace(['\r', '\n'], " ");
    format!("{PREFIX}{package}: {test}{DID_NOT_RUN}{why}\n")
}

/// A skip line, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Skip<'a> {
    /// The package whose test skipped.
    pub package: &'a str,
    /// The test's name.
    pub test: &'a str,
    /// Why it skipped.
    pub why: &'a str,
}

/// The skip in `line`, if it holds a skip line: from [`PREFIX`] (anywhere,
/// in case output without a line break came first) to the end of the line.
pub fn parse(line: &str) -> Option<Skip<'_>> {
    let start = line.find(PREFIX)?;
    let rest = line[start + PREFIX.len()..].trim_end();
    let (package, rest) = rest.split_once(": ")?;
    let (test, why) = rest.split_once(DID_NOT_RUN)?;
    let word = |s: &str| !s.is_empty() && !s.contains(char::is_whitespace);
    (word(package) && word(test)).then_some(Skip { package, test, why })
}

#[cfg(test)]
mod tests {
    use super::{Skip, format, parse};

    #[test]
    fn a_skip_line_parses_back() {
        let line = format(
            "gradwire-optim",
            "adam_matches",
            "no CUDA device (no libcuda.so.1:\nnot found)",
        );
        assert_eq!(
            line,
            "SKIP GPU gradwire-optim: adam_matches did not run its GPU part: \
             no CUDA device (no libcuda.so.1: not found)\n"
        );
        let skip = Skip {
            package: "gradwire-optim",
            test: "adam_matches",
            why: "no CUDA device (no libcuda.so.1: not found)",
        };
        assert_eq!(parse(&line), Some(skip));
        assert_eq!(parse(&format!("partial output{line}")), Some(skip));
    }

    #[test]
    fn other_lines_are_not_skips() {
        for line in [
            "",
            "SKIP shaped network: not root",
            "SKIP: no NCCL library: checking the typed errors only",
            "==================== SKIP ====================",
            "SKIP GPU gradwire-optim: adam did not run",
            "SKIP GPU : adam did not run its GPU part: why",
            "SKIP GPU two words: adam did not run its GPU part: why",
        ] {
            assert_eq!(parse(line), None, "{line:?}");
        }
    }
}
