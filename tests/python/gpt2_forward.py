"""GPT-2's forward pass in numpy, read from a safetensors file as Hugging Face names it.

Usage: gpt2_forward.py WEIGHTS.safetensors N_HEADS OUT.f32 TOKEN [TOKEN ...]

Writes the logits of the token sequence (positions x vocabulary, float32, little-endian) to
OUT.f32. The arithmetic is transformers' GPT2LMHeadModel in eval mode: pre-norm blocks,
LayerNorm eps 1e-5, Conv1D weights stored [in, out], causal softmax attention scaled by
1/sqrt(head width), the tanh GELU ("gelu_new"), the final norm and lm_head.weight (or wte when
the head is tied). Independent of the Rust code it checks.
"""

import sys

import numpy as np
from safetensors.numpy import load_file


def layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def main():
    path, n_heads, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    tokens = np.array([int(t) for t in sys.argv[4:]])
    raw = load_file(path)
    w = {k.removeprefix("transformer."): v.astype(np.float64) for k, v in raw.items()}
    t = len(tokens)
    x = w["wte.weight"][tokens] + w["wpe.weight"][:t]
    d = x.shape[-1]
    dh = d // n_heads
    mask = np.triu(np.ones((t, t), dtype=bool), k=1)
    i = 0
    while f"h.{i}.ln_1.weight" in w:
        p = f"h.{i}."
        h = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"])
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (qkv[:, j * d:(j + 1) * d].reshape(t, n_heads, dh).transpose(1, 0, 2) for j in range(3))
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(dh)
        scores = np.where(mask, -np.inf, scores)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        attn = (scores / scores.sum(-1, keepdims=True)) @ v
        attn = attn.transpose(1, 0, 2).reshape(t, d)
        x = x + attn @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"])
        h = gelu_new(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
        i += 1
    x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"])
    head = w.get("lm_head.weight", w["wte.weight"])
    logits = x @ head.T
    logits.astype("<f4").tofile(out)


if __name__ == "__main__":
    main()
