//! The executables a cargo build reports in its JSON messages, for the
//! test step's runner and for `gpu-bundle`.
//!
//! xtask has no dependencies, so the few fields it needs are read from
//! each message (one JSON object a line) by hand, their escapes decoded.

use crate::{Result, describe};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// An executable the build made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Executable {
    /// The target's name (`it`, `gradwire`, `gradwire_comm`).
    pub(crate) target: String,
    /// The target's root source file.
    pub(crate) src_path: PathBuf,
    /// Its package's `Cargo.toml`.
    pub(crate) manifest_path: PathBuf,
    /// Whether it is a test harness (the test profile's: a unit or
    /// integration test), not a binary built for the tests to run.
    pub(crate) test: bool,
    /// The file.
    pub(crate) path: PathBuf,
}

/// Runs `build` (a `cargo build` or `cargo test --no-run`, to which this
/// adds the JSON message format) with its diagnostics on stderr, and
/// returns the executables it reports, in its order.
pub(crate) fn built(build: &mut Command) -> Result<Vec<Executable>> {
    build.arg("--message-format=json-render-diagnostics");
    let shown = describe(build);
    println!("$ {shown}");
    let output = build
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("could not start `{shown}`: {e}"))?;
    if !output.status.success() {
        return Err(format!("`{shown}` exited with {}", output.status));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    Ok(stdout.lines().filter_map(executable).collect())
}

/// The executable a line of cargo's JSON messages reports, if it reports
/// one (a `compiler-artifact` whose `executable` is a path).
fn executable(line: &str) -> Option<Executable> {
    if string_field(line, "reason")? != "compiler-artifact" {
        return None;
    }
    let path = PathBuf::from(string_field(line, "executable")?);
    let target_object = &line[line.find("\"target\":{")?..];
    let profile = line.split_once("\"profile\":{")?.1.split_once('}')?.0;
    Some(Executable {
        target: string_field(target_object, "name")?,
        src_path: PathBuf::from(string_field(target_object, "src_path")?),
        manifest_path: PathBuf::from(string_field(line, "manifest_path")?),
        test: profile.contains("\"test\":true"),
        path,
    })
}

/// The string value of the first `"key":"..."` in the JSON text `line`,
/// its escapes decoded (`None` where the key is absent or not a string).
fn string_field(line: &str, key: &str) -> Option<String> {
    let rest = line.split_once(&format!("\"{key}\":\""))?.1;
    let mut value = String::new();
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(value),
            '\\' => match chars.next()? {
                'n' => value.push('\n'),
                't' => value.push('\t'),
                'r' => value.push('\r'),
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    value.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                }
                other => value.push(other),
            },
            c => value.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{Executable, executable, string_field};

    /// A test artifact, a binary built for the tests and others.
    #[test]
    fn cargo_messages_name_the_executables() {
        let artifact = |name: &str, test: bool, exe: &str| {
            format!(
                "{{\"reason\":\"compiler-artifact\",\"package_id\":\"path+file:///w/tests#gradwire-tests@0.1.0\",\
                 \"manifest_path\":\"/w/tests/Cargo.toml\",\"target\":{{\"kind\":[\"test\"],\
                 \"crate_types\":[\"bin\"],\"name\":\"{name}\",\"src_path\":\"/w/tests/tests/it/main.rs\",\
                 \"edition\":\"2024\",\"doctest\":false,\"test\":true}},\"profile\":{{\"opt_level\":\"0\",\
                 \"debuginfo\":1,\"debug_assertions\":true,\"overflow_checks\":true,\"test\":{test}}},\
                 \"features\":[],\"filenames\":[\"/t/it-1\"],\"executable\":{exe},\"fresh\":true}}"
            )
        };
        assert_eq!(
            executable(&artifact("it", true, "\"/t/debug/deps/it-1\"")),
            Some(Executable {
                target: "it".into(),
                src_path: "/w/tests/tests/it/main.rs".into(),
                manifest_path: "/w/tests/Cargo.toml".into(),
                test: true,
                path: "/t/debug/deps/it-1".into(),
            })
        );
        let binary = executable(&artifact("gradwire", false, "\"/t/debug/gradwire\"")).unwrap();
        assert_eq!((binary.target.as_str(), binary.test), ("gradwire", false));
        // A library: no executable.
        assert_eq!(executable(&artifact("it", true, "null")), None);
        assert_eq!(
            executable("{\"reason\":\"build-finished\",\"success\":true}"),
            None
        );
        assert_eq!(executable("not json"), None);
    }

    #[test]
    fn string_fields_decode_their_escapes() {
        let line = r#"{"a":1,"path":"/x/a \"b\"\\c\u00e9","n":null}"#;
        assert_eq!(
            string_field(line, "path").as_deref(),
            Some("/x/a \"b\"\\cé")
        );
        assert_eq!(string_field(line, "n"), None);
        assert_eq!(string_field(line, "missing"), None);
        assert_eq!(string_field(r#"{"path":"unterminated"#, "path"), None);
    }
}
