"""Holds te::nn::DotProductAttention (the cases te_interop_attention wrote) to PyTorch's
torch.nn.functional.scaled_dot_product_attention, in float64, outputs and gradients within 1e-5.

How each TE mask type is asked of PyTorch (TE's semantics: transformer_engine/pytorch/attention/
dot_product_attention/dot_product_attention.py and utils.py get_full_mask, at d0067d0da):
  no_mask                      no mask
  causal                       is_causal=True (PyTorch's is top-left, as TE's "causal")
  causal_bottom_right          torch.nn.attention.bias.causal_lower_right(sq, sk)
  padding*                     each sequence alone, cut to its valid queries and keys, with the
                               mask type's diagonal; its padded query rows must be zeros
  thd (packed, cu_seqlens)     each sequence alone likewise, from its (padded) start; the free
                               slots between sequences must be zeros
  arbitrary                    attn_mask = the logical not of te's mask (PyTorch: true = attend)
  window (left, right)         TE's definition: query i sees keys i + off - left ... i + off +
                               right, off = sk - sq (bottom-right) or 0 (top-left causal)
A query row that sees no key must come out zero, as PyTorch's SDPA gives it (torch >= 2.5).

  python check_attention.py CASES.json
"""

import json
import sys

import torch
from interop_common import TOL, tensor
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right


def window_allowed(sq, sk, window, bottom_right, causal):
    """[sq, sk] bool, True = may attend: TE's sliding window (and causal diagonal)."""
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0
    off = sk - sq if bottom_right else 0
    i = torch.arange(sq).view(sq, 1)
    j = torch.arange(sk).view(1, sk)
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        ok &= j >= i + off - left
    if right >= 0:
        ok &= j <= i + off + right
    return ok


def sdpa(q, k, v, scale, mask_type, window, arbitrary=None):
    """q [b, sq, h, d], k/v [b, sk, g, d] -> [b, sq, h, d] by PyTorch's SDPA."""
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    sq, sk = q.shape[1], k.shape[1]
    causal = "causal" in mask_type
    bottom_right = mask_type not in ("causal", "padding_causal")
    kwargs = dict(scale=scale, enable_gqa=True)
    if window is not None:
        mask = window_allowed(sq, sk, window, bottom_right, causal)
        if arbitrary is not None:
            mask = mask & arbitrary
        return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, **kwargs).transpose(1, 2)
    if arbitrary is not None:
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=arbitrary, **kwargs)
    elif mask_type in ("causal", "padding_causal"):
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, **kwargs)
    elif causal:
        out = F.scaled_dot_product_attention(
            qt, kt, vt, attn_mask=causal_lower_right(sq, sk), **kwargs
        )
    else:
        out = F.scaled_dot_product_attention(qt, kt, vt, **kwargs)
    return out.transpose(1, 2)


def reference(c):
    q = tensor(c["q"]).requires_grad_()
    k = tensor(c["k"]).requires_grad_()
    v = tensor(c["v"]).requires_grad_()
    t, window, scale = c["type"], c.get("window"), c["scale"]
    if c.get("format") == "thd":
        # Packed: each sequence alone, its type's causal part; the free slots stay zero.
        one = {"padding": "no_mask", "padding_causal": "causal",
               "padding_causal_bottom_right": "causal_bottom_right"}[t]
        y = torch.zeros(q.shape[0], q.shape[1], q.shape[2], dtype=q.dtype)
        for sq0, lq, sk0, lk in zip(c["starts_q"], c["lengths_q"], c["starts_k"], c["lengths_k"]):
            part = sdpa(q[None, sq0 : sq0 + lq], k[None, sk0 : sk0 + lk], v[None, sk0 : sk0 + lk],
                        scale, one, window)[0]
            y = y.index_add(0, torch.arange(sq0, sq0 + lq), part)
    elif t.startswith("padding"):
        # Sequence by sequence, each cut to its own length: the reference knows nothing of masks.
        rows = []
        for n, length in enumerate(c["lengths"]):
            lq, lk = min(length, c["sq"]), min(length, c["sk"])
            y = torch.zeros(c["sq"], q.shape[2], q.shape[3], dtype=q.dtype)
            if lq > 0 and lk > 0:
                part = sdpa(q[n : n + 1, :lq], k[n : n + 1, :lk], v[n : n + 1, :lk], scale, t,
                            window)[0]
                y = torch.cat([part, y[lq:]], 0)
            rows.append(y)
        y = torch.stack(rows)
    elif t == "arbitrary":
        y = sdpa(q, k, v, scale, t, window, arbitrary=~tensor(c["mask"], torch.bool))
    else:
        y = sdpa(q, k, v, scale, t, window)
    y.backward(tensor(c["dy"]))
    return {"y": y.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def main(path):
    cases = json.load(open(path))
    failures = 0
    for c in cases:
        ref = reference(c)
        name = "%s sq %d sk %d window %s" % (c["type"], c["sq"], c["sk"], c.get("window"))
        for path_name in ("fused", "unfused"):
            got = c[path_name]
            for key in ("y", "dq", "dk", "dv"):
                mine, want = tensor(got[key]), ref[key]
                err = (mine - want).abs().max().item()
                bound = TOL * max(1.0, want.abs().max().item())
                if not err <= bound:
                    failures += 1
                    print("MISMATCH %s %s (%s) %s: max abs error %.3g > %.3g"
                          % (name, path_name, got["backend"], key, err, bound))
    print("check_attention: %d cases x 2 paths x 4 tensors against torch %s: %d mismatches"
          % (len(cases), torch.__version__, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
