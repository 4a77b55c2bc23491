"""The benchmark GPT of `cargo bench -p parcae-model` in PyTorch, for the Burn/PyTorch ratio.

Same architecture as `parcae_model::Gpt` (learned token and position embeddings, pre-norm
blocks with explicit causal attention -- matmul, mask, softmax -- and an exact-GELU MLP, final
LayerNorm, untied bias-free head, mean token cross-entropy), same AdamW settings, random
tokens (the data does not change the speed). Prints one JSON line:
{"seconds_per_step": median, "threads": n}.
"""

import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d, heads, d_ff):
        super().__init__()
        self.heads = heads
        self.ln_attn = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln_mlp = nn.LayerNorm(d)
        self.fc_in = nn.Linear(d, d_ff)
        self.fc_out = nn.Linear(d_ff, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        h, dh = self.heads, d // self.heads
        q, k, v = (
            part.reshape(b, t, h, dh).transpose(1, 2)
            for part in self.qkv(self.ln_attn(x)).split(d, dim=2)
        )
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(dh)
        scores = scores.masked_fill(mask, -1e9)
        attn = (scores.softmax(dim=3) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(attn)
        return x + self.fc_out(F.gelu(self.fc_in(self.ln_mlp(x))))


class Gpt(nn.Module):
    def __init__(self, vocab, d, heads, blocks, seq, d_ff):
        super().__init__()
        self.token = nn.Embedding(vocab, d)
        self.position = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, d_ff) for _ in range(blocks))
        self.ln = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1))

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        x = self.token(tokens) + self.position(torch.arange(t))
        for block in self.blocks:
            x = block(x, self.mask[:t, :t])
        logp = self.lm_head(self.ln(x)).log_softmax(dim=2)
        return -logp.gather(2, targets.unsqueeze(2)).mean()


def main():
    p = argparse.ArgumentParser()
    for name in ["vocab", "d_model", "heads", "blocks", "seq", "d_ff", "batch", "steps", "threads"]:
        p.add_argument(f"--{name}", type=int, required=True)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = Gpt(a.vocab, a.d_model, a.heads, a.blocks, a.seq, a.d_ff)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    times = []
    for step in range(a.steps + 1):
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq))
        targets = torch.randint(0, a.vocab, (a.batch, a.seq))
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(tokens, targets).backward()
        opt.step()
        if step > 0:
            times.append(time.perf_counter() - start)
    print(json.dumps({"seconds_per_step": statistics.median(times), "threads": a.threads}))


if __name__ == "__main__":
    main()
