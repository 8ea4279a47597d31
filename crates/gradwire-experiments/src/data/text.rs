//! A text corpus for the character-level language model: read from a file
//! or a directory (by default Debian's `fortunes` package, 2.6 MB of
//! English text), mapped to a fixed vocabulary of [`VOCAB`] characters, cut
//! into windows of `context + 1` characters (the model reads `context`
//! and predicts each next one), and split into training and test windows
//! by a seed.

use super::shuffle;
use crate::error::{ExperimentError, Result};
use std::path::Path;

/// Where the corpus is by default: the text files of Debian's `fortunes`
/// package (`cargo xtask test` installs it).
pub const DEFAULT_CORPUS: &str = "/usr/share/games/fortunes";

/// Characters the model knows: 0 for any other byte, 1 for a newline, 2
/// for a tab, 3 to 97 for printable ASCII (space to `~`).
pub const VOCAB: usize = 98;

/// The most test windows kept (a tenth of the windows up to this): enough
/// for a stable validation loss, few enough that evaluating it each epoch
/// costs rank 0 little next to the epoch's training.
pub const MAX_TEST_WINDOWS: usize = 512;

/// The most bytes read (the whole of a directory's files, or one file).
const MAX_BYTES: u64 = 1 << 30;

/// The token of byte `b` in the fixed vocabulary of [`VOCAB`].
pub fn token(b: u8) -> u8 {
    match b {
        b'\n' => 1,
        b'\t' => 2,
        32..=126 => b - 29,
        _ => 0,
    }
}

/// A tokenised corpus and its split into windows.
#[derive(Debug, Clone)]
pub struct Corpus {
    tokens: Vec<u8>,
    context: usize,
    /// Start of each training window, ascending.
    train: Vec<usize>,
    /// Start of each test window, ascending.
    test: Vec<usize>,
    /// Training windows per epoch (all of them if `None`).
    epoch_windows: Option<usize>,
}

impl Corpus {
    /// Reads `path`: a file, or a directory whose regular files (not links,
    /// not files with a NUL byte, such as `fortunes`' `.dat` indexes) are
    /// read in name order. Errors if nothing can be read, or if the text
    /// holds fewer than two windows.
    pub fn load(path: &Path, context: usize, seed: u64) -> Result<Corpus> {
        let unreadable = |e: std::io::Error| {
            ExperimentError::Usage(format!(
                "--corpus {}: {e} (install Debian's fortunes package, apt-get install fortunes, \
                 or give --corpus a text file or directory)",
                path.display()
            ))
        };
        let mut text = Vec::new();
        if path.is_dir() {
            let mut files = Vec::new();
            for entry in std::fs::read_dir(path).map_err(unreadable)? {
                let entry = entry.map_err(unreadable)?;
                if entry.file_type().map_err(unreadable)?.is_file() {
                    files.push(entry.path());
                }
            }
            files.sort();
            for file in files {
                let bytes = read_bounded(&file).map_err(unreadable)?;
                if !bytes.contains(&0) {
                    text.extend_from_slice(&bytes);
                }
                if text.len() as u64 > MAX_BYTES {
                    return Err(unreadable(std::io::Error::other(format!(
                        "its files hold more than {MAX_BYTES} bytes"
                    ))));
                }
            }
        } else {
            text = read_bounded(path).map_err(unreadable)?;
        }
        Corpus::from_text(&text, context, seed).map_err(|e| match e {
            ExperimentError::Usage(m) => {
                ExperimentError::Usage(format!("--corpus {}: {m}", path.display()))
            }
            other => other,
        })
    }

    /// `text` tokenised and split: windows of `context + 1` characters
    /// every `context` characters, a tenth of them (at most
    /// [`MAX_TEST_WINDOWS`], at least one) drawn by `seed` for testing.
    pub fn from_text(text: &[u8], context: usize, seed: u64) -> Result<Corpus> {
        if context == 0 {
            return Err(ExperimentError::Usage(
                "--context must be at least 1".into(),
            ));
        }
        let tokens: Vec<u8> = text.iter().map(|&b| token(b)).collect();
        let windows = tokens.len().saturating_sub(1) / context;
        if windows < 2 {
            return Err(ExperimentError::Usage(format!(
                "{} characters hold fewer than two windows of {} (--context {context})",
                tokens.len(),
                context + 1
            )));
        }
        let mut starts: Vec<usize> = (0..windows).map(|w| w * context).collect();
        shuffle(&mut starts, seed);
        let test_len = (windows / 10).clamp(1, MAX_TEST_WINDOWS);
        let mut test = starts[..test_len].to_vec();
        let mut train = starts[test_len..].to_vec();
        test.sort_unstable();
        train.sort_unstable();
        Ok(Corpus {
            tokens,
            context,
            train,
            test,
            epoch_windows: None,
        })
    }

    /// The corpus with epochs of `windows` training windows each (`None`
    /// or more than there are: all of them): an epoch is then an interval
    /// between evaluations, not a pass.
    pub fn with_epoch_windows(self, windows: Option<usize>) -> Corpus {
        Corpus {
            epoch_windows: windows,
            ..self
        }
    }

    /// Training windows per epoch.
    pub fn epoch_len(&self) -> usize {
        self.epoch_windows
            .map_or(self.train.len(), |w| w.min(self.train.len()))
    }

    /// Characters per window the model reads.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Number of training windows.
    pub fn train_len(&self) -> usize {
        self.train.len()
    }

    /// Number of test windows.
    pub fn test_len(&self) -> usize {
        self.test.len()
    }

    /// Training window `i`: `context + 1` tokens (`None` past the end).
    pub fn train_window(&self, i: usize) -> Option<&[u8]> {
        self.window(*self.train.get(i)?)
    }

    /// Test window `i`: `context + 1` tokens (`None` past the end).
    pub fn test_window(&self, i: usize) -> Option<&[u8]> {
        self.window(*self.test.get(i)?)
    }

    fn window(&self, start: usize) -> Option<&[u8]> {
        self.tokens.get(start..start + self.context + 1)
    }
}

/// The bytes of `path`, refused past [`MAX_BYTES`].
fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(std::io::Error::other(format!(
            "more than {MAX_BYTES} bytes"
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::assert_usage;

    #[test]
    fn the_vocabulary_is_fixed_and_covers_every_byte() {
        let mut seen = [false; VOCAB];
        for b in 0..=255u8 {
            seen[usize::from(token(b))] = true;
        }
        assert!(seen.iter().all(|&s| s), "every token is some byte's");
        assert_eq!(token(b' '), 3);
        assert_eq!(token(b'~'), 97);
        assert_eq!(token(b'\n'), 1);
        assert_eq!(token(0xC3), 0);
    }

    /// Every window is where the split says, train and test are disjoint
    /// and together cover every window, for several lengths (primes among
    /// them) and contexts; the split follows the seed.
    #[test]
    fn windows_tile_the_text_and_split_by_the_seed() {
        for (len, context) in [(3usize, 1usize), (23, 5), (1009, 7), (4096, 64)] {
            let text: Vec<u8> = (0..len).map(|i| b' ' + (i % 90) as u8).collect();
            let corpus = Corpus::from_text(&text, context, 3).unwrap();
            let windows = (len - 1) / context;
            assert_eq!(corpus.train_len() + corpus.test_len(), windows);
            assert_eq!(corpus.test_len(), (windows / 10).clamp(1, MAX_TEST_WINDOWS));
            let mut starts: Vec<usize> = corpus.train.iter().chain(&corpus.test).copied().collect();
            starts.sort_unstable();
            assert_eq!(
                starts,
                (0..windows).map(|w| w * context).collect::<Vec<_>>()
            );
            for i in 0..corpus.train_len() {
                let w = corpus.train_window(i).unwrap();
                let start = corpus.train[i];
                assert_eq!(w.len(), context + 1);
                let expected: Vec<u8> = text[start..=start + context]
                    .iter()
                    .map(|&b| token(b))
                    .collect();
                assert_eq!(w, expected);
            }
            assert!(corpus.train_window(corpus.train_len()).is_none());
            assert!(corpus.test_window(corpus.test_len()).is_none());
        }
        let text = vec![b'a'; 5000];
        let a = Corpus::from_text(&text, 8, 1).unwrap();
        assert_eq!(a.test, Corpus::from_text(&text, 8, 1).unwrap().test);
        assert_ne!(a.test, Corpus::from_text(&text, 8, 2).unwrap().test);
    }

    #[test]
    fn too_little_text_and_a_missing_corpus_are_usage_errors() {
        assert_usage(Corpus::from_text(b"abc", 2, 1), "fewer than two windows");
        assert_usage(Corpus::from_text(b"", 1, 1), "fewer than two windows");
        assert_usage(Corpus::from_text(b"abcdef", 0, 1), "--context must be");
        assert_usage(
            Corpus::load(Path::new("/nonexistent/corpus"), 8, 1),
            "apt-get install fortunes",
        );
    }

    /// A directory is read file by file in name order, binary files and
    /// links left out.
    #[test]
    fn a_directory_reads_its_text_files_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b"), b"second part\n").unwrap();
        std::fs::write(dir.path().join("a"), b"first part\n").unwrap();
        std::fs::write(dir.path().join("a.dat"), b"\0\0\x01index").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(dir.path().join("a"), dir.path().join("a.u8")).unwrap();
        let corpus = Corpus::load(dir.path(), 1, 1).unwrap();
        let expected: Vec<u8> = b"first part\nsecond part\n"
            .iter()
            .map(|&b| token(b))
            .collect();
        assert_eq!(corpus.tokens, expected);
    }
}
