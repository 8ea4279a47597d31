//! A lint of PTX text for what would break the promises the CPU cannot test:
//! every kernel's result is a function of its inputs alone (bitwise the
//! CPU's where the device path says so, deterministic everywhere), so no
//! instruction may round differently from the CPU's IEEE operations or
//! depend on timing.
//!
//! [`lint`] reports, per instruction:
//! - [`Rule::FloatAtomic`]: `atom` / `red` on a floating-point type. The
//!   order of the additions depends on timing, and `red.global.add.f32`
//!   flushes subnormals.
//! - [`Rule::FlushToZero`]: a `.ftz` modifier (the CPU keeps subnormals).
//! - [`Rule::Approximate`]: `.approx` or `.full` (an approximate division,
//!   square root, reciprocal or transcendental).
//! - [`Rule::FusedMultiplyAdd`]: `fma`, or `mad` on a float type (Rust never
//!   contracts `a * x + y`; integer `mad.lo` / `mad.wide` are fine).
//! - [`Rule::PartialWarpMask`]: a warp-synchronous instruction (`vote.sync`,
//!   `shfl.sync`, `match.sync`, `redux.sync`, `bar.warp.sync`) whose member
//!   mask is not all 32 lanes, either as an immediate or as a register every
//!   definition of which in the function is `mov` of the full mask. Every
//!   kernel calls them with all lanes converged; a partial mask means lanes
//!   that may not arrive, which hangs or reads undefined values.
//!
//! This crate's tests lint every committed module (`kernels/tests/lint.rs`,
//! part of `cargo xtask test`), and plant each kind of fault in a real module
//! to show it is caught.

use std::collections::HashMap;
use std::fmt;

/// What a [`Finding`] breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// A floating-point atomic (`atom.*.f32`, `red.*.f64`, ...).
    FloatAtomic,
    /// A `.ftz` modifier.
    FlushToZero,
    /// An approximate operation (`.approx`, `.full`).
    Approximate,
    /// A fused multiply-add (`fma`, float `mad`).
    FusedMultiplyAdd,
    /// A warp-synchronous instruction without the full member mask.
    PartialWarpMask,
}

/// One instruction the lint refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The rule it breaks.
    pub rule: Rule,
    /// Its line in the PTX text, from 1.
    pub line: usize,
    /// The instruction as written (trimmed).
    pub text: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {:?}: `{}`", self.line, self.rule, self.text)
    }
}

/// One instruction: its line, opcode (`vote.sync.ballot.b32`) and operands.
struct Instruction<'a> {
    line: usize,
    text: &'a str,
    opcode: &'a str,
    operands: Vec<&'a str>,
}

impl Instruction<'_> {
    /// The opcode's dot-separated parts after the first (`sync`, `ballot`,
    /// `b32`).
    fn modifiers(&self) -> impl Iterator<Item = &str> {
        self.opcode.split('.').skip(1)
    }

    fn name(&self) -> &str {
        self.opcode.split('.').next().unwrap_or(self.opcode)
    }

    /// The registers it writes: its first operand, split at `|` (`setp` and
    /// `shfl.sync` may write a predicate beside it).
    fn destinations(&self) -> impl Iterator<Item = &str> {
        self.operands
            .first()
            .into_iter()
            .flat_map(|d| d.split('|'))
            .map(str::trim)
    }
}

/// The instruction on a line of PTX, if it holds one (not a directive, a
/// label, a brace or a comment); a guard (`@%p1`, `@!%p1`) is dropped.
fn instruction(line: usize, raw: &str) -> Option<Instruction<'_>> {
    let code = raw.split("//").next().unwrap_or("").trim();
    let code = code.strip_suffix(';')?.trim();
    if code.starts_with('.') || code.ends_with(':') || code.is_empty() {
        return None;
    }
    let code = match code.strip_prefix('@') {
        Some(guarded) => guarded.split_once(char::is_whitespace)?.1.trim(),
        None => code,
    };
    let (opcode, rest) = code.split_once(char::is_whitespace).unwrap_or((code, ""));
    let operands = if rest.trim().is_empty() {
        Vec::new()
    } else {
        rest.split(',').map(str::trim).collect()
    };
    Some(Instruction {
        line,
        text: code,
        opcode,
        operands,
    })
}

const FLOAT_TYPES: [&str; 6] = ["f16", "f16x2", "bf16", "bf16x2", "f32", "f64"];

fn is_float_type(part: &str) -> bool {
    FLOAT_TYPES.contains(&part)
}

/// An immediate equal to a full 32-lane mask.
fn is_full_mask_immediate(operand: &str) -> bool {
    let o = operand.trim().to_ascii_lowercase();
    let o = o.strip_suffix('u').unwrap_or(&o);
    o == "-1" || o == "4294967295" || o == "0xffffffff"
}

/// Whether the instruction synchronises a warp on a member mask (its last
/// operand).
fn takes_member_mask(i: &Instruction<'_>) -> bool {
    let sync = i.modifiers().any(|m| m == "sync");
    match i.name() {
        "vote" | "shfl" | "match" | "redux" => sync,
        "bar" | "barrier" => i.modifiers().next() == Some("warp") && sync,
        _ => false,
    }
}

/// The findings of one function's instructions.
fn lint_function(body: &[Instruction<'_>], out: &mut Vec<Finding>) {
    // Every definition of each register in the function, for the masks.
    let mut definitions: HashMap<&str, Vec<&Instruction<'_>>> = HashMap::new();
    for i in body {
        for d in i.destinations() {
            if d.starts_with('%') {
                definitions.entry(d).or_default().push(i);
            }
        }
    }
    let full_mask = |operand: &str| {
        if is_full_mask_immediate(operand) {
            return true;
        }
        let Some(defs) = definitions.get(operand.trim()) else {
            return false;
        };
        defs.iter().all(|d| {
            d.name() == "mov" && d.operands.len() == 2 && is_full_mask_immediate(d.operands[1])
        })
    };
    for i in body {
        let mut find = |rule| {
            out.push(Finding {
                rule,
                line: i.line,
                text: i.text.to_string(),
            })
        };
        let name = i.name();
        if (name == "atom" || name == "red") && i.modifiers().any(is_float_type) {
            find(Rule::FloatAtomic);
        }
        if i.modifiers().any(|m| m == "ftz") {
            find(Rule::FlushToZero);
        }
        if i.modifiers().any(|m| m == "approx" || m == "full") {
            find(Rule::Approximate);
        }
        if name == "fma" || (name == "mad" && i.modifiers().any(is_float_type)) {
            find(Rule::FusedMultiplyAdd);
        }
        if takes_member_mask(i) && !i.operands.last().is_some_and(|m| full_mask(m)) {
            find(Rule::PartialWarpMask);
        }
    }
}

/// Every instruction of `ptx` that breaks a [`Rule`], in line order.
pub fn lint(ptx: &str) -> Vec<Finding> {
    let mut findings = Vec::new();
    let mut body = Vec::new();
    for (n, raw) in ptx.lines().enumerate() {
        let trimmed = raw.trim_start();
        // A function starts at its `.entry` / `.func` directive; registers
        // are named per function.
        if trimmed.contains(".entry ") || trimmed.contains(".func ") {
            lint_function(&body, &mut findings);
            body.clear();
        }
        if let Some(i) = instruction(n + 1, raw) {
            body.push(i);
        }
    }
    lint_function(&body, &mut findings);
    findings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_are_split_into_opcode_and_operands() {
        let i = instruction(3, "\t@!%p2 vote.sync.ballot.b32 \t%r7, %p1, %r24; // c").unwrap();
        assert_eq!(i.opcode, "vote.sync.ballot.b32");
        assert_eq!(i.operands, ["%r7", "%p1", "%r24"]);
        assert_eq!(i.line, 3);
        for not_one in ["\t.reg .b32 %r<9>;", "$L__BB0_2:", "{", "// ret;", ""] {
            assert!(instruction(1, not_one).is_none(), "{not_one}");
        }
        assert_eq!(instruction(1, "\tret;").unwrap().opcode, "ret");
    }

    #[test]
    fn masks_are_full_only_as_all_ones() {
        for full in ["-1", "0xffffffff", "0xFFFFFFFF", "4294967295"] {
            assert!(is_full_mask_immediate(full), "{full}");
        }
        for partial in ["65535", "0x0000ffff", "%r1", "0"] {
            assert!(!is_full_mask_immediate(partial), "{partial}");
        }
    }
}
