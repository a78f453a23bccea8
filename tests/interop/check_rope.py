"""Holds te::nn's rotary position embeddings (the cases te_interop_rope wrote) to Hugging Face
transformers: the half rotation to Llama's (LlamaRotaryEmbedding, rope_type "default" and
"linear", and apply_rotary_pos_emb), the interleaved one to GPT-J's
(create_sinusoidal_positions and apply_rotary_pos_emb), in float64 on te's inputs; output and
gradient within 1e-5. A partial rotary dim rotates the first d2 dims and passes the rest (as
GPT-J's rotary_dim); start positions are the position_ids of a sequence continued from a cache;
a packed (thd) batch is each sequence alone, its positions from 0.

  python check_rope.py CASES.json
"""

import json
import sys

import torch
from interop_common import TOL, tensor
import transformers
from transformers import LlamaConfig
from transformers.models.gptj import modeling_gptj
from transformers.models.llama import modeling_llama


def rotate(x, position_ids, c):
    """x [b, s, h, d2] (float64), position_ids [b, s] -> the reference rotation."""
    d2 = c["d2"]
    if c["interleaved"]:
        table = modeling_gptj.create_sinusoidal_positions(64, d2)  # base 10000, as GPT-J
        sincos = table[position_ids].to(x.dtype)
        sin, cos = torch.split(sincos, d2 // 2, dim=-1)
        return modeling_gptj.apply_rotary_pos_emb(x, sin, cos)
    rope = {"rope_type": "default", "rope_theta": c["base"]}
    if "factor" in c:
        rope = {"rope_type": "linear", "rope_theta": c["base"], "factor": c["factor"]}
    config = LlamaConfig(hidden_size=d2 * x.shape[2], num_attention_heads=x.shape[2],
                         head_dim=d2, rope_parameters=rope)
    cos, sin = modeling_llama.LlamaRotaryEmbedding(config)(x, position_ids)
    q, _ = modeling_llama.apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=2)
    return q


def rotate_part(x, position_ids, c):
    d2 = c["d2"]
    return torch.cat([rotate(x[..., :d2], position_ids, c), x[..., d2:]], -1)


def reference(c):
    t = tensor(c["t"]).requires_grad_(True)
    start = c.get("start_positions")
    if c["format"] == "thd":
        parts, offset = [], 0
        for n, length in enumerate(c["lengths"]):
            pos = torch.arange(length).view(1, length) + (start[n] if start else 0)
            parts.append(rotate_part(t[offset : offset + length].unsqueeze(0), pos, c)[0])
            offset += length
        y = torch.cat(parts, 0)
    else:
        x = t if c["format"] == "bshd" else t.transpose(0, 1)
        b, s = x.shape[0], x.shape[1]
        pos = torch.arange(s).view(1, s).expand(b, s)
        if start:
            pos = pos + torch.tensor(start).view(b, 1)
        y = rotate_part(x, pos, c)
        if c["format"] == "sbhd":
            y = y.transpose(0, 1)
    y.backward(tensor(c["dy"]))
    return {"y": y.detach(), "dt": t.grad}


def main(path):
    cases = json.load(open(path))
    failures = 0
    for c in cases:
        ref = reference(c)
        name = "%s %s d2 %d base %g factor %s start %s" % (
            c["format"], "interleaved (GPT-J)" if c["interleaved"] else "halves (Llama)",
            c["d2"], c["base"], c.get("factor"), "start_positions" in c)
        for key in ("y", "dt"):
            mine, want = tensor(c[key]), ref[key]
            err = (mine - want).abs().max().item()
            bound = TOL * max(1.0, want.abs().max().item())
            if not err <= bound:
                failures += 1
                print("MISMATCH %s %s: max abs error %.3g > %.3g" % (name, key, err, bound))
    print("check_rope: %d cases x 2 tensors against transformers %s (torch %s): %d mismatches"
          % (len(cases), transformers.__version__, torch.__version__, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
