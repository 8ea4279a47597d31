#!/usr/bin/env bash
# gpu_suite.sh: runs the GPU suites that `cargo xtask gpu-bundle` built, on a
# machine with an NVIDIA GPU, a driver, and NCCL inside a Python installation
# (PyTorch's nvidia-nccl wheel) or on the loader path; no Rust toolchain.
#
#   gpu_suite.sh [suites] [sanitize] [bench]     (no argument: all three)
#
# suites    every test binary with GRADWIRE_REQUIRE_GPU=1 (a missing GPU or
#           NCCL fails instead of skipping), one at a time
# sanitize  compute-sanitizer memcheck and racecheck over the kernel suites
# bench     gradwire bench kernels (device codecs against a device-to-device
#           copy), the NCCL all-reduce bench, and torch_bench.py (PyTorch's
#           topk, casts and copy on the same GPU) when torch is installed
#
# Logs go to $OUT (or ./gpu-out): env.txt, suites.log, sanitize.log,
# bench.txt, summary.txt. The exit status is non-zero when a stage failed.

set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(suites sanitize bench)
summary=$out/summary.txt
: >"$summary"
failed=0

note() { echo "$*" | tee -a "$summary"; }

# NCCL: the nvidia-nccl wheel's lib folder (PyTorch's), else the loader's.
nccl_dir=$(python3 - <<'PY' 2>/dev/null
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
for root in roots:
    for hit in glob.glob(os.path.join(root, "nvidia", "nccl", "lib", "libnccl.so*")):
        print(os.path.dirname(hit)); raise SystemExit
PY
)
if [ -z "$nccl_dir" ]; then
    hit=$(find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -n 1)
    [ -n "$hit" ] && nccl_dir=$(dirname "$hit")
fi
[ -n "$nccl_dir" ] && export LD_LIBRARY_PATH="$nccl_dir:${LD_LIBRARY_PATH:-}"
export GRADWIRE_REQUIRE_GPU=1
export RUST_BACKTRACE=1

{
    date -u
    nvidia-smi || echo "nvidia-smi failed"
    echo "NCCL folder: ${nccl_dir:-not found}"
    ls -l "${nccl_dir:-/nonexistent}" 2>/dev/null
    command -v compute-sanitizer || echo "no compute-sanitizer"
    python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>&1
} >"$out/env.txt" 2>&1

run_suites() {
    local log=$out/suites.log
    : >"$log"
    local one
    one=$(mktemp)
    for t in "$here"/tests/*; do
        local name
        name=$(basename "$t")
        local start=$SECONDS
        if timeout 300 "$t" --test-threads=1 >"$one" 2>&1; then
            note "PASS $name ($((SECONDS - start)) s)"
        else
            note "FAIL $name ($((SECONDS - start)) s; see suites.log)"
            failed=1
        fi
        # This binary's own verdict line (none if it crashed).
        grep -E '^test result' "$one" >>"$summary" || echo "  (no test result line)" >>"$summary"
        { echo "=== $name"; cat "$one"; } >>"$log"
    done
    rm -f "$one"
}

run_sanitize() {
    local log=$out/sanitize.log
    : >"$log"
    if ! command -v compute-sanitizer >/dev/null; then
        note "SKIP sanitize: no compute-sanitizer"
        return
    fi
    for t in "$here"/tests/gradwire-tensor--cuda "$here"/tests/gradwire-compress--cuda \
        "$here"/tests/gradwire-optim--cuda "$here"/tests/gradwire-algos--cuda; do
        [ -x "$t" ] || continue
        for tool in memcheck racecheck; do
            echo "=== $tool $(basename "$t")" >>"$log"
            if timeout 280 compute-sanitizer --tool "$tool" --error-exitcode 97 \
                "$t" --test-threads=1 >>"$log" 2>&1; then
                note "PASS $tool $(basename "$t")"
            else
                note "FAIL $tool $(basename "$t") (see sanitize.log)"
                failed=1
            fi
        done
    done
}

run_bench() {
    local log=$out/bench.txt
    : >"$log"
    echo "=== gradwire bench kernels" >>"$log"
    timeout 240 "$here/gradwire" bench kernels --sizes 1M,16M,64M >>"$log" 2>&1 \
        || { note "FAIL bench kernels"; failed=1; }
    echo "=== gradwire bench allreduce --backend nccl" >>"$log"
    timeout 120 "$here/gradwire" bench allreduce --backend nccl --world 1 \
        --sizes 64K,1M,16M,64M >>"$log" 2>&1 || { note "FAIL bench allreduce nccl"; failed=1; }
    if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
        echo "=== torch_bench.py" >>"$log"
        timeout 120 python3 "$here/torch_bench.py" --sizes 1M,16M,64M >>"$log" 2>&1 \
            || { note "FAIL torch_bench"; failed=1; }
    else
        note "SKIP torch_bench: no torch with CUDA"
    fi
    note "bench: see bench.txt"
}

for stage in "${stages[@]}"; do
    case $stage in
    suites) run_suites ;;
    sanitize) run_sanitize ;;
    bench) run_bench ;;
    *) note "unknown stage $stage"; failed=1 ;;
    esac
done
exit $failed
