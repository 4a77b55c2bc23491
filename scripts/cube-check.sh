#!/usr/bin/env bash
# The Cube code paths on this CPU (issue 65): the stage's operations and a pipeline on Burn's Cube
# backend, run through wgpu's Vulkan on Mesa's lavapipe, where no GPU is. Run it after every change
# to the operations (model/src/ops) and before every GPU check; its result goes in docs/gpu.md.
# CI does not run it (its cold build of the Cube backend takes ~25 minutes on two cores).
#
#   scripts/cube-check.sh [--out DIR]
#
# 1. the operations' tests (values and every gradient against Burn's composition, with and
#    without gradient checkpointing) and 20 training steps of native against reference
#    operations, on Flex and on the Cube CPU runtime;
# 2. the GPU check's dry run on the Cube CPU runtime (scripts/gpu-check.sh --device cube-cpu):
#    smoke against Flex, train-bench native and reference, the per-kernel split, and four
#    parcae-node processes as 2x2 through a churning trace with SIGTERM notices, checked and
#    replayed.
# The binaries it builds (target/release, with the `cube-cpu` feature) also run `--device cpu`.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/cube-check
while (($#)); do
    case $1 in
        --out) out=$2; shift 2 ;;
        *) echo "cube-check: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done
scripts/setup-cube-cpu.sh
export CARGO_INCREMENTAL=0
# Software Vulkan compiles every kernel on the CPU: tune each matmul shape once, cheaply, and draw
# four shapes per property (the property tests' 16 run on Flex in CI).
export CUBECL_AUTOTUNE_LEVEL=${CUBECL_AUTOTUNE_LEVEL:-minimal}
export PROPTEST_CASES=${PROPTEST_CASES:-4}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
started=$SECONDS
cargo test --release -p parcae-model --features cube-cpu --lib ops
cargo test --release -p parcae-model --features cube-cpu --test training \
    native_and_reference_operations_train_the_same_losses
echo "cube-check: operation tests passed in $((SECONDS - started)) s"
cargo build --release -p parcae-node -p parcae-testnet --features parcae-node/cube-cpu
rm -rf "$out"
scripts/gpu-check.sh --device cube-cpu --bin target/release --out "$out" \
    --parts smoke,train,train-reference,train-kernels,pipeline
python3 - "$out/gpu-check.json" <<'PY'
import json, sys
summary = json.load(open(sys.argv[1]))
failed = [p for p, s in summary["parts"].items() if s not in ("ok", "skipped")]
pipe = summary["pipeline"]
bad = (not summary["smoke"]["passed"] or failed or not pipe["committed_steps"]
       or pipe["lost_committed_steps"] != 0 or pipe["duplicate_samples"] != 0
       or not pipe["history_check_passed"])
print(json.dumps({"parts": summary["parts"], "smoke": summary["smoke"]["passed"],
                  "pipeline": pipe}, indent=2))
sys.exit(1 if bad else 0)
PY
echo "cube-check: passed in $((SECONDS - started)) s ($out/gpu-check.json)"
