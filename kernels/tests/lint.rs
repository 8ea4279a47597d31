//! The PTX lint ([`gradwire_kernels::lint`]) on every committed module, and
//! on modules with a fault planted in them: each kind of fault is caught
//! where it was planted, and nowhere else.

use gradwire_kernels::lint::{Rule, lint};
use gradwire_kernels::{MODULES, module};

#[test]
fn every_module_passes_the_lint() {
    for m in MODULES {
        let findings = lint(m.ptx);
        assert!(
            findings.is_empty(),
            "{}.ptx:\n{}",
            m.name,
            findings
                .iter()
                .map(|f| format!("  {f}\n"))
                .collect::<String>()
        );
    }
}

/// `ptx` with the first line containing `find` replaced by `with` (the
/// replaced line's number, from 1).
fn plant(ptx: &str, find: &str, with: &str) -> (String, usize) {
    let mut at = None;
    let lines: Vec<String> = ptx
        .lines()
        .enumerate()
        .map(|(n, line)| {
            if at.is_none() && line.contains(find) {
                at = Some(n + 1);
                with.to_string()
            } else {
                line.to_string()
            }
        })
        .collect();
    (
        lines.join("\n"),
        at.unwrap_or_else(|| panic!("no line holds `{find}`")),
    )
}

fn ptx_of(name: &str) -> &'static str {
    module(name)
        .unwrap_or_else(|| panic!("no module {name}"))
        .ptx
}

#[test]
fn each_planted_fault_is_caught_on_its_line() {
    let cases = [
        // A float atomic where feedback.cu's scatter-add uses a plain add.
        (
            "feedback",
            "red.global.min.u64",
            "\tred.global.add.f32 \t[%rd9], %f1;",
            Rule::FloatAtomic,
        ),
        (
            "feedback",
            "red.global.min.u64",
            "\tatom.global.add.f64 \t%fd1, [%rd9], %fd2;",
            Rule::FloatAtomic,
        ),
        (
            "optim",
            "sqrt.rn.f32",
            "\tsqrt.approx.f32 \t%f9, %f8;",
            Rule::Approximate,
        ),
        (
            "optim",
            "div.rn.f32",
            "\tdiv.full.f32 \t%f9, %f8, %f7;",
            Rule::Approximate,
        ),
        (
            "optim",
            "div.rn.f32",
            "\tdiv.rn.ftz.f32 \t%f9, %f8, %f7;",
            Rule::FlushToZero,
        ),
        (
            "optim",
            "div.rn.f32",
            "\tfma.rn.f32 \t%f9, %f8, %f7, %f6;",
            Rule::FusedMultiplyAdd,
        ),
        (
            "optim",
            "div.rn.f32",
            "\tmad.rn.f64 \t%fd9, %fd8, %fd7, %fd6;",
            Rule::FusedMultiplyAdd,
        ),
        // The ballot's mask register defined as half a warp.
        (
            "select",
            "mov.u32 \t%r24, -1;",
            "\tmov.u32 \t%r24, 65535;",
            Rule::PartialWarpMask,
        ),
        // An immediate partial mask.
        (
            "select",
            "vote.sync.ballot.b32",
            "\tvote.sync.ballot.b32 \t%r7, %p1, 255;",
            Rule::PartialWarpMask,
        ),
        (
            "select",
            "bar.sync",
            "\tbar.warp.sync \t%r3;",
            Rule::PartialWarpMask,
        ),
    ];
    for (name, find, with, rule) in cases {
        let (planted, line) = plant(ptx_of(name), find, with);
        let findings = lint(&planted);
        assert!(!findings.is_empty(), "{name}: `{with}` was not caught");
        for f in &findings {
            assert_eq!(f.rule, rule, "{name}: `{with}`: {f}");
            // A planted mask definition is reported at its uses.
            if rule != Rule::PartialWarpMask || !with.contains("mov.") {
                assert_eq!(f.line, line, "{name}: `{with}`: {f}");
            }
        }
    }
}

#[test]
fn integer_atomics_and_integer_multiply_adds_are_allowed() {
    let ok = "\
.visible .entry k(
)
{
\tmov.u32 \t%r24, 0xffffffff;
\tatom.global.add.u64 \t%rd1, [%rd2], 1;
\tred.shared.add.u64 \t[%rd3], %rd4;
\tmad.lo.s32 \t%r1, %r2, %r3, %r4;
\tmad.wide.u32 \t%rd5, %r1, 4, %rd6;
\tshfl.sync.down.b32 \t%r5|%p1, %r6, 1, 31, %r24;
\t@%p1 bra \t$L__BB0_2;
$L__BB0_2:
\tret;
}
";
    assert_eq!(lint(ok), vec![]);
    // The same mask register redefined as something else in another
    // function does not matter; redefined in this one, it does.
    let redefined = ok.replace("\tret;", "\tadd.s32 \t%r24, %r24, -2;\n\tret;");
    let findings = lint(&redefined);
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert_eq!(findings[0].rule, Rule::PartialWarpMask);
}
