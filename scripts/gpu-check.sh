#!/usr/bin/env bash
# The GPU check (second edition: issue 65), for one short run on a machine with a GPU and no
# network: run it from the repository root with binaries built elsewhere (a host that can build:
# README, GPUs).
#
#   scripts/gpu-check.sh --device cuda --bin DIR --out DIR [--parts smoke,profile,train,torch,pipeline]
#   scripts/gpu-check.sh --device cpu  --bin target/debug --out /tmp/check   # the dry run, small models
#   scripts/gpu-check.sh --device cube-cpu --bin DIR --out /tmp/check       # the same on Cube (lavapipe)
#
# DIR holds parcae-node (built with `--features cuda` for a GPU) and parcae-testnet, each plain or
# xz-compressed (NAME.xz). The parts run in this order, each on its own, so that a failure early
# still leaves what ran:
#   smoke     a few tensor operations and one training step of a small GPT on the device against
#             Flex (the first command that loads the PTX the linked LLVM generated);
#   profile   `parcae-node profile` of gpt2-124m and gpt2-355m (tiny and small on a CPU;
#             profile-MODEL names one);
#   train     `parcae-node train-bench`: one process, 30 steps at a fixed batch on a token file,
#             the native operations (train-reference: Burn's composition; train-gb32: four
#             micro-batches a step; train-again: the same in a second process, after the first
#             left its caches; train-recompute: with Burn's gradient checkpointing;
#             train-kernels: a few steps with cubecl's profiling logger, each kernel's calls
#             and time);
#   torch     scripts/torch_bench.py: the same model, batch and optimizer in PyTorch, eager TF32,
#             eager strict f32, eager bf16 autocast and (with --compile) torch.compile (skipped
#             without torch);
#   pipeline  four parcae-node processes sharing the device as 2x2, a churning trace with SIGTERM
#             notices, checked: no committed step lost, no sample trained twice, and one process
#             trains the committed steps again on the device (`--replay`): weights and losses
#             against the cluster's; then the newest checkpoint exported on the device with its
#             logits, and the same file read by transformers (scripts/hf_logits.py).
# PYTHON names the interpreter with torch and transformers (python3 by default).
# Every part's output is a JSON file in --out and its log in --out/log.txt; the summary
# (--out/gpu-check.json) has the issue's keys, null where a part did not run or has no such value.
set -uo pipefail

device=cuda
bin=target/release
out=gpu-check
parts=smoke,profile,train,train-reference,train-gb32,train-kernels,torch,pipeline
compile=0
while (($#)); do
    case $1 in
        --device) device=$2; shift 2 ;;
        --bin) bin=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --parts) parts=$2; shift 2 ;;
        --compile) compile=1; shift ;;
        *) echo "gpu-check: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done
python=${PYTHON:-python3}
for name in parcae-node parcae-testnet; do
    [[ -x $bin/$name || -f $bin/$name.xz ]] || {
        echo "gpu-check: no executable $bin/$name (nor $bin/$name.xz) (--bin)" >&2
        exit 2
    }
done
bin=$(cd "$bin" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
# A binary may come xz-compressed (NAME.xz: the CUDA build of parcae-node carries LLVM and is
# ~170 MiB stripped, ~33 MiB compressed): unpacked into --out/bin with python's lzma.
unpacked() {
    if [[ -x $bin/$1 ]]; then
        echo "$bin/$1"
    else
        mkdir -p "$out/bin"
        "$python" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
            "$bin/$1.xz" "$out/bin/$1" && chmod +x "$out/bin/$1" && echo "$out/bin/$1"
    fi
}
node=$(unpacked parcae-node) && testnet=$(unpacked parcae-testnet) || {
    echo "gpu-check: cannot unpack the binaries of $bin" >&2
    exit 2
}
exec > >(tee -a "$out/log.txt") 2>&1

# A GPU runs GPT-2; the CPU dry runs (Flex, and Cube on lavapipe) the same commands on models
# they finish in seconds.
if [[ $device == cpu || $device == cube-cpu ]]; then
    models=(tiny small); train_model=small; mb=2; gb=8; steps=5; vocab=4096
    if [[ $device == cube-cpu ]]; then
        # Lavapipe runs every kernel on the CPU: small's 5 steps took over the part limit
        # warm (2026-12-06), so the Cube dry run trains tiny, the paths being the same.
        models=(tiny); train_model=tiny; vocab=64
    fi
    pipeline_model=tiny; pipeline_heads=4; pipeline_activation=gelu; pipeline_interval=20
    logit_tokens=5,17,29,0,42,42,7,63,1,3,50,11,10,47,31,9
    peak_tflops=""
else
    # One micro-batch of 8 a step (train-gb32 runs four): at global batch 32 the reference stage
    # ran out of an H100's 80 GB on 2026-11-28 (it keeps each layer's attention scores).
    models=(gpt2-124m gpt2-355m); train_model=gpt2-124m; mb=8; gb=8; steps=30; vocab=50257
    # A GPU node's first plan waits for its layers to be measured, kernels compiled and tuned
    # (41 s on the first H100 run): intervals of 20 s ended before a step was committed.
    pipeline_model=gpt2-124m; pipeline_heads=12; pipeline_activation=gelu_new; pipeline_interval=30
    logit_tokens=5,17,299,0,42,42,7,128,64,3,250,11,1000,2047,31,50256
    # An H100 SXM's dense TF32 (the precision of f32 matmuls on tensor cores).
    peak_tflops="--peak-tflops 494.7"
fi

wants() { [[ ,$parts, == *,$1,* ]]; }
status=()
# The longest a part may take, seconds: a lent GPU runs one command for at most 10 minutes, and
# a part that hangs must leave the time to the next.
limit() {
    case $1 in
        smoke | train | train-reference | train-again | train-recompute | train-kernels) echo 180 ;;
        train-gb32) echo 240 ;;
        profile-*) echo 150 ;;
        torch-*) echo 90 ;;
        pipeline) echo 330 ;;
        *) echo 120 ;;
    esac
}
part() {
    local name=$1; shift
    echo "== $name: $* ($(date -u +%H:%M:%S))"
    local t0=$SECONDS rc=0
    timeout -k 10 "$(limit "$name")" "$@" || rc=$?
    case $rc in
        0) status+=("$name=ok") ;;
        124 | 137) status+=("$name=timed-out") ;;
        *) status+=("$name=failed") ;;
    esac
    echo "== $name: ${status[-1]#*=} in $((SECONDS - t0)) s"
}

wants smoke && part smoke "$node" smoke --device "$device" --out "$out/smoke.json"

for m in "${models[@]}"; do
    if wants profile || wants "profile-$m"; then
        part "profile-$m" "$node" profile --device "$device" --model "$m" --micro-batch "$mb" \
            --global-batch "$gb" --out "$out/profile-$m.json"
    fi
done

# Random ids below the trained model's vocabulary (GPT-2's, small's 4096 or tiny's 64 on a
# CPU), little-endian u16.
tokens=$out/tokens.u16
python3 - "$tokens" "$vocab" <<'PY'
import array, random, sys
rng = random.Random(0)
ids = array.array("H", (rng.randrange(int(sys.argv[2])) for _ in range(2_000_000)))
if sys.byteorder != "little":
    ids.byteswap()
open(sys.argv[1], "wb").write(ids.tobytes())
PY

# train-reference: the same batch on Burn's composed operations (what the stage ran before its
# own operations). train-gb32: four micro-batches a step. train-again: the same run in a fresh
# process after the first, with the autotune results cubecl kept on disk (its cache, under
# target/ of the working directory): a second start. train-recompute: the same batch with
# Burn's gradient checkpointing (memory against speed).
for run in train train-reference train-gb32 train-again train-recompute; do
    if wants "$run"; then
        extra=() batch=$gb
        case $run in
            train-reference) extra=(--ops reference) ;;
            train-gb32) batch=$((4 * mb)) ;;
            train-recompute) extra=(--gradient-checkpointing) ;;
        esac
        # shellcheck disable=SC2086 # flags and their values, or nothing
        part "$run" "$node" train-bench --device "$device" --model "$train_model" \
            --micro-batch "$mb" --global-batch "$batch" --steps "$steps" --tokens "$tokens" \
            $peak_tflops "${extra[@]}" --out "$out/$run.json"
    fi
done

# train-kernels: a few steps with cubecl's profiling logger on (a cubecl.toml in the working
# directory; it syncs after every kernel, so it gives the split, not the total), summed per
# kernel into kernels.json.
if wants train-kernels && [[ $device != cpu ]]; then
    mkdir -p "$out/kernels"
    rm -f "$out/kernels/cubecl-profile.log"
    printf '[profiling.logger]\nlevel = "basic"\nfile = "cubecl-profile.log"\nappend = false\n' \
        > "$out/kernels/cubecl.toml"
    part train-kernels env -C "$out/kernels" "$node" train-bench --device "$device" \
        --model "$train_model" --micro-batch "$mb" --global-batch "$gb" --steps 3 \
        --tokens "$tokens" --out "$out/kernels/train.json"
    python3 - "$out/kernels/cubecl-profile.log" "$out/kernels.json" <<'PY'
import json, re, sys
units = {"s": 1e3, "ms": 1.0, "µs": 1e-3, "us": 1e-3, "ns": 1e-6}
line = re.compile(r"^\|\s*([0-9.]+)(s|ms|µs|us|ns)\s*\|\s*(.+?)\s*$")
kernels = {}
try:
    text = open(sys.argv[1], encoding="utf-8", errors="replace").read()
except OSError:
    text = ""
for raw in text.splitlines():
    m = line.match(raw)
    if m:
        k = kernels.setdefault(m.group(3), {"name": m.group(3), "calls": 0, "total_ms": 0.0})
        k["calls"] += 1
        k["total_ms"] += float(m.group(1)) * units[m.group(2)]
ranked = sorted(kernels.values(), key=lambda k: -k["total_ms"])
json.dump({"kernels": ranked, "total_ms": sum(k["total_ms"] for k in ranked)},
          open(sys.argv[2], "w"), indent=2)
print(f"kernels: {len(ranked)} distinct, {sum(k['calls'] for k in ranked)} calls")
PY
fi

if wants torch; then
    if "$python" -c "import torch, transformers" 2>/dev/null; then
        for precision in tf32 f32 bf16; do
            part "torch-$precision" "$python" scripts/torch_bench.py --device "$device" \
                --model "$train_model" --micro-batch "$mb" --global-batch "$gb" --steps "$steps" \
                --tokens "$tokens" --precision "$precision" --out "$out/torch-$precision.json"
        done
        if ((compile)); then
            part torch-compiled "$python" scripts/torch_bench.py --device "$device" \
                --model "$train_model" --micro-batch "$mb" --global-batch "$gb" --steps "$steps" \
                --tokens "$tokens" --compile --out "$out/torch-compiled.json"
        fi
    else
        echo "== torch: skipped ($python has no torch and transformers here)"
        status+=("torch=skipped")
    fi
fi

if wants pipeline; then
    rm -rf "$out/pipeline"
    part pipeline env PARCAE_NODE_BIN="$node" "$testnet" run --device "$device" \
        --model "$pipeline_model" --nodes-max 4 --pin 2x2 --trace synthetic:hh:15 --intervals 4 \
        --interval-secs "$pipeline_interval" --replay --check --work-dir "$out/pipeline" \
        --json "$out/pipeline.json" --out "$out/plots"
    # The newest stored checkpoint exported on the device, its logits there, and the same
    # file read by transformers.
    run=$out/pipeline/liveput
    part export "$node" export --config "$run/node0.toml" --store "$run/store" \
        --device "$device" --out "$out/model.safetensors" --logits-tokens "$logit_tokens" \
        --logits-out "$out/node-logits.f32"
    if "$python" -c "import torch, transformers" 2>/dev/null; then
        part hf-logits "$python" scripts/hf_logits.py --weights "$out/model.safetensors" \
            --heads "$pipeline_heads" --activation "$pipeline_activation" \
            --node-logits "$out/node-logits.f32" --tokens "$logit_tokens" --device "$device" \
            --out "$out/hf-logits.json"
    else
        echo "== hf-logits: skipped ($python has no torch and transformers here)"
        status+=("hf-logits=skipped")
    fi
fi

python3 - "$out" "$device" "${status[@]}" <<'PY'
import json, os, sys, time
out, device, statuses = sys.argv[1], sys.argv[2], sys.argv[3:]
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
smoke, train = load("smoke.json"), load("train.json")
torch_tf32, pipe = load("torch-tf32.json"), load("pipeline.json")
get = lambda d, k: d.get(k) if d else None
burn, torch = get(train, "tokens_per_s"), get(torch_tf32, "tokens_per_s")
summary = {
    "date": time.strftime("%Y-%m-%d", time.gmtime()),
    "device": get(smoke, "device") or get(train, "device") or device,
    # This call's parts over those of an earlier call with the same --out.
    "parts": {**(get(load("gpu-check.json"), "parts") or {}),
              **dict(s.split("=", 1) for s in statuses)},
    "smoke": {"passed": get(smoke, "passed"), "checks": get(smoke, "checks")},
    "profiles": {f[8:-5]: load(f) is not None for f in sorted(os.listdir(out))
                 if f.startswith("profile-") and f.endswith(".json")},
    "train": {
        "burn_tokens_per_s": burn,
        "torch_tokens_per_s": torch,
        "torch_f32_tokens_per_s": get(load("torch-f32.json"), "tokens_per_s"),
        "torch_bf16_tokens_per_s": get(load("torch-bf16.json"), "tokens_per_s"),
        "torch_compiled_tokens_per_s": get(load("torch-compiled.json"), "tokens_per_s"),
        "burn_vs_torch": burn / torch if burn and torch else None,
        "mfu": get(train, "mfu"),
        "cold_start_s": get(train, "cold_start_s"),
        "second_start_s": get(load("train-again.json"), "cold_start_s"),
        "torch_cold_start_s": get(torch_tf32, "cold_start_s"),
        "peak_memory_bytes": get(train, "peak_memory_bytes"),
        "torch_peak_memory_bytes": get(torch_tf32, "peak_memory_bytes"),
        "recompute_tokens_per_s": get(load("train-recompute.json"), "tokens_per_s"),
        "recompute_peak_memory_bytes": get(load("train-recompute.json"), "peak_memory_bytes"),
        "ops": get(train, "ops"),
        "reference_tokens_per_s": get(load("train-reference.json"), "tokens_per_s"),
        "reference_peak_memory_bytes": get(load("train-reference.json"), "peak_memory_bytes"),
        "global_batch_32": {
            "burn_tokens_per_s": get(load("train-gb32.json"), "tokens_per_s"),
            "peak_memory_bytes": get(load("train-gb32.json"), "peak_memory_bytes"),
        },
    },
    # The kernels of a few steps, slowest first (cubecl's profiling logger; train-kernels).
    "profile": {"kernels": (get(load("kernels.json"), "kernels") or [])[:40]},
    "pipeline": {
        # One process trained the committed steps again on the device (`run --replay`).
        "loss_max_abs_diff": get(get(pipe, "history_check"), "replay_max_loss_diff"),
        "weights_max_abs_diff": get(get(pipe, "history_check"), "replay_max_abs_diff"),
        "history_check_passed": get(get(pipe, "history_check"), "passed"),
        "committed_steps": get(pipe, "committed_steps"),
        "lost_committed_steps": get(pipe, "lost_committed_steps"),
        "duplicate_samples": get(pipe, "duplicate_samples"),
        "loss_first": get(pipe, "loss_first"),
        "loss_last": get(pipe, "loss_last"),
    },
    "export": {
        "hf_logits_max_abs_diff": get(load("hf-logits.json"), "hf_logits_max_abs_diff"),
        "max_abs_logit": get(load("hf-logits.json"), "max_abs_logit"),
    },
}
with open(os.path.join(out, "gpu-check.json"), "w") as f:
    json.dump(summary, f, indent=2)
print(json.dumps(summary["parts"]), "->", os.path.join(out, "gpu-check.json"))
PY
