#!/usr/bin/env python3
"""The PyTorch side of the GPU check: the same model, batch, optimizer and precision as
`parcae-node train-bench`, trained in PyTorch on the same card, timed the same way.

The model is Hugging Face's GPT2LMHeadModel at parcae-model's preset sizes (pre-norm blocks,
learned positions, an untied head, no dropout; tanh GELU for the GPT-2 presets, erf GELU for
tiny and small, as parcae-model's presets have them). The optimizer is AdamW with GPT-2's
settings (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.01) and gradients clipped to a
global norm of 1, the loss the mean cross-entropy over the step's micro-batches. Each step's
clock stops after the loss is read back (a device sync). Precision: f32 weights and optimizer;
`tf32` lets matmuls run in TF32 as cuBLAS may, `f32` forbids it, `bf16` runs the forward under
bf16 autocast (mixed precision with f32 master weights: what a bf16 stage would gain).

Writes one JSON object: tokens/s at the warm median, the first step, peak memory.
"""

import argparse
import array
import json
import statistics
import sys
import time

PRESETS = {
    # name: (vocab, d_model, heads, blocks, seq_len, d_ff, activation)
    "tiny": (64, 32, 4, 2, 16, 128, "gelu"),
    "small": (4096, 512, 8, 6, 128, 2048, "gelu"),
    "gpt2-124m": (50257, 768, 12, 12, 1024, 3072, "gelu_new"),
    "gpt2-355m": (50257, 1024, 16, 24, 1024, 4096, "gelu_new"),
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="gpt2-124m", choices=sorted(PRESETS))
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--tokens", help="little-endian u16 token file (random ids without it)")
    p.add_argument("--precision", choices=["tf32", "f32", "bf16"], default="tf32")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    if a.steps < 2 or a.micro_batch < 1 or a.global_batch % a.micro_batch:
        p.error("--steps >= 2 and --global-batch a multiple of --micro-batch")
    return a


def examples(args, vocab, seq):
    """Yields (inputs, targets) lists of `seq` tokens: windows of seq + 1 at i * seq."""
    need = args.steps * args.global_batch * seq + 1
    if args.tokens:
        ids = array.array("H")
        with open(args.tokens, "rb") as f:
            ids.frombytes(f.read(need * 2))
        if sys.byteorder != "little":
            ids.byteswap()
        if len(ids) < need:
            sys.exit(f"--tokens {args.tokens}: {len(ids)} tokens, the bench needs {need}")
        if max(ids) >= vocab:
            sys.exit(f"--tokens {args.tokens}: an id is >= the vocabulary {vocab}")
    else:
        import random

        rng = random.Random(0)
        ids = [rng.randrange(vocab) for _ in range(need)]
    for i in range(args.steps * args.global_batch):
        window = ids[i * seq : i * seq + seq + 1]
        yield list(window[:-1]), list(window[1:])


def main():
    args = parse_args()
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    vocab, d, heads, blocks, seq, ff, act = PRESETS[args.model]
    seq = args.seq_len or seq
    allow = args.precision != "f32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow
    torch.manual_seed(0)
    device = torch.device(args.device)
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=seq,
        n_embd=d,
        n_layer=blocks,
        n_head=heads,
        n_inner=ff,
        activation_function=act,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=False,
        bos_token_id=vocab - 1,
        eos_token_id=vocab - 1,
    )
    started = time.perf_counter()
    model = GPT2LMHeadModel(config).to(device).train()
    params = sum(p.numel() for p in model.parameters())
    step_fn = torch.compile(model) if args.compile else model
    opt = torch.optim.AdamW(
        model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01
    )
    data = examples(args, vocab, seq)
    per_step = args.global_batch // args.micro_batch
    losses, step_s = [], []
    cold_start_s = None
    for _ in range(args.steps):
        batches = []
        for _ in range(per_step):
            pairs = [next(data) for _ in range(args.micro_batch)]
            x = torch.tensor([p[0] for p in pairs], dtype=torch.long, device=device)
            y = torch.tensor([p[1] for p in pairs], dtype=torch.long, device=device)
            batches.append((x, y))
        t = time.perf_counter()
        total = 0.0
        for x, y in batches:
            with torch.autocast(device.type, torch.bfloat16, enabled=args.precision == "bf16"):
                logits = step_fn(input_ids=x).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
            (loss / per_step).backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(total) / per_step)  # reads back: the step's work is done
        step_s.append(time.perf_counter() - t)
        if cold_start_s is None:
            cold_start_s = time.perf_counter() - started
    warm = statistics.median(step_s[1:])
    peak = torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None
    report = {
        "framework": f"torch {torch.__version__}" + (" compiled" if args.compile else " eager"),
        "model": args.model,
        "params": params,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": args.precision,
        "micro_batch": args.micro_batch,
        "global_batch": args.global_batch,
        "seq_len": seq,
        "steps": args.steps,
        "cold_start_s": cold_start_s,
        "first_step_s": step_s[0],
        "warm_step_s": warm,
        "tokens_per_s": args.global_batch * seq / warm,
        "peak_memory_bytes": peak,
        "losses": losses,
        "step_s": step_s,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(
        f"wrote {args.out} ({report['framework']}, {args.model}, {args.precision}: "
        f"{report['tokens_per_s']:.0f} tokens/s warm, first step {step_s[0]:.1f} s)"
    )


if __name__ == "__main__":
    main()
