"""Holds te::nn's attention biases and softmax sinks (the cases te_interop_bias wrote) to Hugging
Face transformers, in float64 on te's inputs and weights:
  - TE's default ALiBi slopes to BLOOM's _get_alibi_slopes, for head counts that are and are
    not powers of two;
  - MultiHeadAttention with core_attention_bias_type "alibi" under a padding_causal mask to
    BloomAttention given build_alibi_tensor and the same causal padding mask, te's fused QKV
    kernel copied into BLOOM's head-interleaved query_key_value. BLOOM's bias is slope * j, TE's
    -slope * (i - j): they differ by a constant per query row, which the softmax cancels, so the
    outputs are equal on the valid query rows (a padded query's row is zero in te, as in TE, and
    arbitrary in BLOOM; the gradients given zero there);
  - DotProductAttention with softmax_type "learnable" (and "off-by-one": zero sinks) to gpt-oss's
    eager_attention_forward with module.sinks, with and without GQA, causal and padding_causal
    (a padded query's row: the sink takes it whole in gpt-oss, zero in te, the same output).
Outputs and gradients within 1e-5.

  python check_bias.py CASES.json
"""

import sys
import types

import torch
import transformers
from interop_common import rel_err as err
from interop_common import run_cases, tensor
from transformers import BloomConfig
from transformers.models.bloom import modeling_bloom
from transformers.models.gpt_oss import modeling_gpt_oss


def check_slopes(c):
    worst = 0.0
    for heads, want in c["slopes"].items():
        ref = modeling_bloom._get_alibi_slopes(int(heads), torch.device("cpu")).to(torch.float64)
        worst = max(worst, err(tensor(want), ref))
    return {"slopes": worst}


def causal_padding_mask(lengths, s):
    """BLOOM's 4-D additive mask: causal, and every key at or beyond its row's length hidden."""
    b = len(lengths)
    keys = torch.arange(s).view(1, 1, 1, s) >= torch.tensor(lengths).view(b, 1, 1, 1)
    hidden = keys | torch.ones(s, s, dtype=torch.bool).triu(1).view(1, 1, s, s)
    return torch.zeros(b, 1, s, s, dtype=torch.float64).masked_fill(
        hidden, torch.finfo(torch.float64).min)


def check_alibi(c):
    heads = c["heads"]
    x0 = tensor(c["x"])
    b, s, hidden = x0.shape
    d = hidden // heads
    config = BloomConfig(hidden_size=hidden, n_head=heads, attention_dropout=0.0,
                         hidden_dropout=0.0)
    attn = modeling_bloom.BloomAttention(config, layer_idx=0).to(torch.float64).eval()
    # te's qkv_kernel [hidden, 3, heads * d] (slot t, head h, dim e) is BLOOM's
    # query_key_value.weight row (h * 3 + t) * d + e.
    k = tensor(c["qkv_kernel"]).view(hidden, 3, heads, d)
    kb = tensor(c["qkv_bias"]).view(3, heads, d)
    with torch.no_grad():
        attn.query_key_value.weight.copy_(k.permute(2, 1, 3, 0).reshape(3 * hidden, hidden))
        attn.query_key_value.bias.copy_(kb.permute(1, 0, 2).reshape(3 * hidden))
        attn.dense.weight.copy_(tensor(c["out_kernel"]).t())
        attn.dense.bias.copy_(tensor(c["out_bias"]))
    lengths = c["lengths"]
    mask2d = (torch.arange(s).view(1, s) < torch.tensor(lengths).view(b, 1)).to(torch.float64)
    alibi = modeling_bloom.build_alibi_tensor(mask2d, heads, torch.float64)
    x = x0.clone().requires_grad_(True)
    y, _ = attn(x, torch.zeros_like(x), alibi, causal_padding_mask(lengths, s))
    valid = (torch.arange(s).view(1, s, 1) < torch.tensor(lengths).view(b, 1, 1)).to(y.dtype)
    y.backward(tensor(c["dy"]))
    w = attn.query_key_value.weight.grad.view(heads, 3, d, hidden).permute(3, 1, 0, 2)
    wb = attn.query_key_value.bias.grad.view(heads, 3, d).permute(1, 0, 2)
    return {
        "y (valid rows)": err(tensor(c["y"]) * valid, y.detach() * valid),
        # A padded query attends to nothing: its row is the output projection's bias alone.
        "padded rows": err(tensor(c["y"]) * (1 - valid), tensor(c["out_bias"]) * (1 - valid)),
        "dx": err(tensor(c["dx"]), x.grad),
        "d qkv_kernel": err(tensor(c["d_qkv_kernel"]), w.reshape(hidden, 3, hidden)),
        "d qkv_bias": err(tensor(c["d_qkv_bias"]), wb.reshape(3, hidden)),
        "d out_kernel": err(tensor(c["d_out_kernel"]), attn.dense.weight.grad.t()),
    }


def check_sink(c):
    # gpt-oss's layout is [b, h, s, d]; te's [b, s, h, d].
    q = tensor(c["q"]).transpose(1, 2).requires_grad_(True)
    k = tensor(c["k"]).transpose(1, 2).requires_grad_(True)
    v = tensor(c["v"]).transpose(1, 2).requires_grad_(True)
    heads = q.shape[1]
    learnable = c["softmax_type"] == "learnable"
    sinks = tensor(c["sinks"]) if learnable else torch.zeros(heads, dtype=torch.float64)
    sinks.requires_grad_(learnable)
    module = types.SimpleNamespace(sinks=sinks, num_key_value_groups=heads // c["groups"],
                                   training=False)
    s = q.shape[2]
    if "lengths" in c:
        mask = causal_padding_mask(c["lengths"], s)
        # A padded query sees no key at all (te's padding mask hides the padded queries too).
        padded_q = torch.arange(s).view(1, 1, s, 1) >= torch.tensor(c["lengths"]).view(-1, 1, 1, 1)
        mask = mask.masked_fill(padded_q, torch.finfo(torch.float64).min)
    else:
        mask = torch.zeros(1, 1, s, s, dtype=torch.float64).masked_fill(
            torch.ones(s, s, dtype=torch.bool).triu(1), torch.finfo(torch.float64).min)
    out, _ = modeling_gpt_oss.eager_attention_forward(module, q, k, v, mask, c["scale"])
    out.backward(tensor(c["dy"]))  # out is [b, s, h, d], as te's
    result = {
        "y": err(tensor(c["y"]), out.detach()),
        "dq": err(tensor(c["dq"]), q.grad.transpose(1, 2)),
        "dk": err(tensor(c["dk"]), k.grad.transpose(1, 2)),
        "dv": err(tensor(c["dv"]), v.grad.transpose(1, 2)),
    }
    if learnable:
        result["d sinks"] = err(tensor(c["dsinks"]), sinks.grad)
    return result


def check(c):
    if c["kind"] == "slopes":
        return "ALiBi slopes for %s heads" % ", ".join(c["slopes"]), check_slopes(c)
    if c["kind"] == "alibi":
        return ("ALiBi (BLOOM) %d heads %s" % (c["heads"], "fused" if c["fused"] else "unfused"),
                check_alibi(c))
    return ("softmax %s (gpt-oss sinks) %d kv heads, %s" % (
        c["softmax_type"], c["groups"], "padding_causal" if "lengths" in c else "causal"),
        check_sink(c))


if __name__ == "__main__":
    sys.exit(run_cases(sys.argv[1], check, "transformers " + transformers.__version__))
