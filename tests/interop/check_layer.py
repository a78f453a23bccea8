"""Holds te::nn's layer structures (the cases te_interop_layer wrote) to Hugging Face
transformers, in float64 with te's weights copied across:
  - TransformerLayer with output_layernorm and apply_residual_connection_post_layernorm (BERT's
    post-LN layer, tanh gelu) to BertLayer (hidden_act "gelu_new", eager attention) under a
    padding mask: outputs on the valid query rows (a padded query's attention is zero in te, as
    in TE; BERT attends it to the valid keys) and every gradient, given zero on the padded rows;
  - MultiHeadAttention with qk_norm_type RMSNorm before RoPE, GQA and a causal mask to
    Qwen3Attention (per-head q_norm/k_norm, rope_theta), output and every gradient.
Within 1e-5.

  python check_layer.py CASES.json
"""

import sys

import torch
import transformers
from interop_common import rel_err as err
from interop_common import run_cases, tensor
from transformers import BertConfig, Qwen3Config
from transformers.models.bert import modeling_bert
from transformers.models.qwen3 import modeling_qwen3


def copy(dst, src):
    with torch.no_grad():
        dst.copy_(src)


def check_bert(c):
    p = {k: tensor(v) for k, v in c["params"].items()}
    g = {k: tensor(v) for k, v in c["grads"].items()}
    hidden = p["layernorm.scale"].shape[0]
    config = BertConfig(hidden_size=hidden, num_attention_heads=4,
                        intermediate_size=p["mlp.wo_kernel"].shape[0], hidden_act="gelu_new",
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        layer_norm_eps=1e-12, attn_implementation="eager")
    layer = modeling_bert.BertLayer(config).to(torch.float64).eval()
    att = layer.attention
    qkv, qkv_b = p["self_attention.qkv_kernel"], p["self_attention.qkv_bias"]
    for slot, lin in enumerate([att.self.query, att.self.key, att.self.value]):
        copy(lin.weight, qkv[:, slot, :].t())
        copy(lin.bias, qkv_b[slot])
    copy(att.output.dense.weight, p["self_attention.out_kernel"].t())
    copy(att.output.dense.bias, p["self_attention.out_bias"])
    copy(att.output.LayerNorm.weight, p["mlp.layernorm.scale"])
    copy(att.output.LayerNorm.bias, p["mlp.layernorm.ln_bias"])
    copy(layer.intermediate.dense.weight, p["mlp.wi_kernel"][:, 0, :].t())
    copy(layer.intermediate.dense.bias, p["mlp.wi_bias"][0])
    copy(layer.output.dense.weight, p["mlp.wo_kernel"].t())
    copy(layer.output.dense.bias, p["mlp.wo_bias"])
    copy(layer.output.LayerNorm.weight, p["layernorm.scale"])
    copy(layer.output.LayerNorm.bias, p["layernorm.ln_bias"])
    x0 = tensor(c["x"])
    b, s, _ = x0.shape
    lengths = torch.tensor(c["lengths"])
    keys = torch.arange(s).view(1, 1, 1, s) >= lengths.view(b, 1, 1, 1)
    mask = torch.zeros(b, 1, 1, s, dtype=torch.float64).masked_fill(
        keys, torch.finfo(torch.float64).min)
    x = x0.clone().requires_grad_(True)
    y = layer(x, mask)
    if isinstance(y, tuple):
        y = y[0]
    y.backward(tensor(c["dy"]))
    valid = (torch.arange(s).view(1, s, 1) < lengths.view(b, 1, 1)).to(y.dtype)
    out = {"y (valid rows)": err(tensor(c["y"]) * valid, y.detach() * valid),
           "dx": err(tensor(c["dx"]), x.grad)}
    ref = {
        "self_attention.qkv_kernel": torch.stack(
            [lin.weight.grad.t() for lin in [att.self.query, att.self.key, att.self.value]], 1),
        "self_attention.qkv_bias": torch.stack(
            [lin.bias.grad for lin in [att.self.query, att.self.key, att.self.value]]),
        "self_attention.out_kernel": att.output.dense.weight.grad.t(),
        "self_attention.out_bias": att.output.dense.bias.grad,
        "mlp.layernorm.scale": att.output.LayerNorm.weight.grad,
        "mlp.layernorm.ln_bias": att.output.LayerNorm.bias.grad,
        "mlp.wi_kernel": layer.intermediate.dense.weight.grad.t().unsqueeze(1),
        "mlp.wi_bias": layer.intermediate.dense.bias.grad.unsqueeze(0),
        "mlp.wo_kernel": layer.output.dense.weight.grad.t(),
        "mlp.wo_bias": layer.output.dense.bias.grad,
        "layernorm.scale": layer.output.LayerNorm.weight.grad,
        "layernorm.ln_bias": layer.output.LayerNorm.bias.grad,
    }
    missing = set(g) - set(ref)
    if missing:
        raise SystemExit("check_layer.py: te parameters with no BERT counterpart: %s" % missing)
    for k, v in ref.items():
        out["d " + k] = err(g[k], v)
    return out


def check_qwen3(c):
    p = {k: tensor(v) for k, v in c["params"].items()}
    g = {k: tensor(v) for k, v in c["grads"].items()}
    heads, groups, d = c["heads"], c["groups"], c["head_dim"]
    hidden = p["q_kernel"].shape[0]
    config = Qwen3Config(hidden_size=hidden, num_attention_heads=heads,
                         num_key_value_heads=groups, head_dim=d, rms_norm_eps=1e-6,
                         attention_bias=False, attention_dropout=0.0,
                         rope_parameters={"rope_type": "default", "rope_theta": c["rope_theta"]},
                         attn_implementation="eager")
    attn = modeling_qwen3.Qwen3Attention(config, layer_idx=0).to(torch.float64).eval()
    copy(attn.q_proj.weight, p["q_kernel"].t())
    copy(attn.k_proj.weight, p["kv_kernel"][:, 0, :].t())
    copy(attn.v_proj.weight, p["kv_kernel"][:, 1, :].t())
    copy(attn.o_proj.weight, p["out_kernel"].t())
    copy(attn.q_norm.weight, p["q_norm.scale"])
    copy(attn.k_norm.weight, p["k_norm.scale"])
    x0 = tensor(c["x"])
    b, s, _ = x0.shape
    x = x0.clone().requires_grad_(True)
    pos = torch.arange(s).view(1, s).expand(b, s)
    cos, sin = modeling_qwen3.Qwen3RotaryEmbedding(config)(x, pos)
    causal = torch.zeros(1, 1, s, s, dtype=torch.float64).masked_fill(
        torch.ones(s, s, dtype=torch.bool).triu(1), torch.finfo(torch.float64).min)
    y, _ = attn(x, (cos, sin), causal)
    y.backward(tensor(c["dy"]))
    ref = {
        "q_kernel": attn.q_proj.weight.grad.t(),
        "kv_kernel": torch.stack([attn.k_proj.weight.grad.t(), attn.v_proj.weight.grad.t()], 1),
        "out_kernel": attn.o_proj.weight.grad.t(),
        "q_norm.scale": attn.q_norm.weight.grad,
        "k_norm.scale": attn.k_norm.weight.grad,
    }
    missing = set(g) - set(ref)
    if missing:
        raise SystemExit("check_layer.py: te parameters with no Qwen3 counterpart: %s" % missing)
    out = {"y": err(tensor(c["y"]), y.detach()), "dx": err(tensor(c["dx"]), x.grad)}
    for k, v in ref.items():
        out["d " + k] = err(g[k], v)
    return out


def check(c):
    if c["kind"] == "bert":
        return "post-LN layer (BertLayer)", check_bert(c)
    return "RMSNorm qk-norm before RoPE, GQA (Qwen3Attention)", check_qwen3(c)


if __name__ == "__main__":
    sys.exit(run_cases(sys.argv[1], check, "transformers " + transformers.__version__))
