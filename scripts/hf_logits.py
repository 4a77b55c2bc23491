"""Do Hugging Face transformers and the node read an exported model alike?

Usage: hf_logits.py --weights MODEL.safetensors --heads N --node-logits LOGITS.f32
                    --tokens 1,2,3 [--activation gelu_new] [--device cuda] --out RESULT.json

MODEL.safetensors is what `parcae-node export` wrote (Hugging Face GPT-2 names, an untied
lm_head); LOGITS.f32 the logits the node computed from it on its device
(`--logits-tokens`/`--logits-out`: positions x vocabulary, float32, little-endian). The sizes
are read from the tensors' shapes (the head count is not in them: --heads). transformers'
GPT2LMHeadModel runs in eval mode, strict f32 (no TF32), and the largest absolute difference of
the logits goes to RESULT.json with the largest logit for scale.
"""

import argparse
import json

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--weights", required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--node-logits", required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--activation", default="gelu_new", help="gelu_new (GPT-2 presets) or gelu")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if a.device.startswith("cuda") and torch.cuda.is_available() else "cpu"

    state = load_file(a.weights)
    vocab, d = state["transformer.wte.weight"].shape
    positions = state["transformer.wpe.weight"].shape[0]
    layers = len({k.split(".")[2] for k in state if k.startswith("transformer.h.")})
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=positions,
        n_embd=d,
        n_layer=layers,
        n_head=a.heads,
        activation_function=a.activation,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=False,
    )
    model = GPT2LMHeadModel(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # The attention's causal-mask buffers are not weights; anything else missing is an error.
    missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias"))]
    if missing or unexpected:
        raise SystemExit(f"hf_logits: the file does not fit GPT-2: missing {missing}, unexpected {unexpected}")
    model = model.to(device).eval()

    tokens = [int(t) for t in a.tokens.split(",")]
    with torch.no_grad():
        ids = torch.tensor([tokens], device=device)
        theirs = model(ids).logits[0].float().cpu().numpy()
    ours = np.fromfile(a.node_logits, dtype="<f4")
    if ours.size != theirs.size:
        raise SystemExit(f"hf_logits: the node wrote {ours.size} logits, transformers has {theirs.size}")
    ours = ours.reshape(theirs.shape)
    result = {
        "device": device,
        "tokens": len(tokens),
        "vocab": int(vocab),
        "layers": layers,
        "hf_logits_max_abs_diff": float(np.abs(ours - theirs).max()),
        "max_abs_logit": float(np.abs(theirs).max()),
    }
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
