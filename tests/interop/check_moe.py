"""Holds te::nn's MoE router, losses and token permutation (the cases te_interop_moe wrote) to the
reference math Transformer Engine tests its fused kernels against and Megatron-LM computes, in
PyTorch, float64, on te's inputs: every output and gradient within 1e-5 (routing maps exact).

The references follow, in our own code, the semantics of
- TE d0067d0da tests/pytorch/test_fused_router.py: group_limited_topk,
  topk_score_function_pytorch, compute_scores_for_aux_loss_pytorch, aux_loss_pytorch;
- TE d0067d0da tests/pytorch/test_permutation.py: pytorch_permute_mask_map,
  pytorch_unpermute_mask_map, pytorch_permute_index_map, pytorch_unpermute_index_map;
- TE d0067d0da tests/pytorch/test_permutation.py pytorch_sort_chunks_by_index;
- Megatron-LM d98e8a64 megatron/core/transformer/moe/moe_utils.py z_loss_func,
  get_capacity and apply_router_token_dropping (drop_policy "probs"), and router.py
  _apply_seq_aux_loss (sequence-first [seqlen, batch * experts], divided by the batch size; te's
  tensors are batch-first, so the reference transposes them to Megatron's layout first).

  python check_moe.py CASES.json
"""

import math
import sys

import torch
from interop_common import run_cases, rel_err, tensor


def top(scores, c):
    """The top-k of scores [tokens, experts] (values, indices), group-limited when set."""
    k, groups, group_topk = c["topk"], c["num_groups"], c["group_topk"]
    if not group_topk:
        return torch.topk(scores, k=k, dim=1)
    tokens, experts = scores.shape
    group_scores = scores.view(tokens, groups, -1).topk(k // group_topk, dim=-1)[0].sum(-1)
    chosen = torch.topk(group_scores, k=group_topk, dim=-1, sorted=False)[1]
    keep = torch.zeros_like(group_scores).scatter(1, chosen, 1).bool()
    keep = keep.unsqueeze(-1).expand(tokens, groups, experts // groups).reshape(tokens, -1)
    return torch.topk(scores.masked_fill(~keep, float("-inf")), k=k, dim=-1)


def bounded(logits, f):
    return torch.sigmoid(logits) if f == "sigmoid" else torch.nn.functional.softplus(logits).sqrt()


def router(c):
    logits = tensor(c["logits"]).requires_grad_(True)
    f, k = c["score_function"], c["topk"]
    if f == "softmax":
        if c["use_pre_softmax"]:
            probs, idx = top(torch.softmax(logits, -1), c)
        else:
            best, idx = top(logits, c)
            probs = torch.softmax(best, -1)
    else:
        scores = bounded(logits, f)
        if "expert_bias" in c:
            _, idx = top(scores + tensor(c["expert_bias"]), c)
            probs = torch.gather(scores, 1, idx)
        else:
            probs, idx = top(scores, c)
        probs = probs / (probs.sum(-1, keepdim=True) + 1e-20) if k > 1 else probs
    if c["scaling_factor"]:
        probs = probs * c["scaling_factor"]
    dense = torch.zeros_like(logits).scatter(1, idx, probs)
    routing_map = torch.zeros_like(logits).scatter(1, idx, 1.0).detach()
    dense.backward(tensor(c["dprobs"]))
    name = "router %s%s k %d groups %d/%d%s scale %g" % (
        f, " pre-softmax" if c["use_pre_softmax"] else "", k, c["num_groups"], c["group_topk"],
        " expert_bias" if "expert_bias" in c else "", c["scaling_factor"])
    return name, {"probs": rel_err(tensor(c["probs"]), dense.detach()),
                  "routing_map": rel_err(tensor(c["routing_map"]), routing_map),
                  "dlogits": rel_err(tensor(c["dlogits"]), logits.grad)}


def aux_scores(c):
    logits = tensor(c["logits"]).requires_grad_(True)
    f = c["score_function"]
    if f == "softmax":
        scores = torch.softmax(logits, -1)
    else:
        scores = bounded(logits, f)
        scores = scores / (scores.sum(-1, keepdim=True) + 1e-20)
    idx = torch.topk(scores, k=c["topk"], dim=1)[1]
    routing_map = torch.zeros_like(logits).scatter(1, idx, 1.0).detach()
    scores.backward(tensor(c["dscores"]))
    return "aux-loss scores " + f, {
        "scores": rel_err(tensor(c["scores"]), scores.detach()),
        "routing_map": rel_err(tensor(c["routing_map"]), routing_map),
        "dlogits": rel_err(tensor(c["dlogits"]), logits.grad)}


def switch_loss(probs, tokens_per_expert, total, topk, experts, coeff):
    return (probs.sum(0) * tokens_per_expert).sum() * (experts * coeff / (topk * total * total))


def losses(c):
    logits = tensor(c["logits"]).requires_grad_(True)
    b, s, e = logits.shape
    k = c["topk"]
    scores = torch.softmax(logits, -1)
    idx = torch.topk(scores, k=k, dim=-1)[1]
    routing_map = torch.zeros_like(logits).scatter(-1, idx, 1.0).detach()
    aux = switch_loss(scores.reshape(-1, e), routing_map.reshape(-1, e).sum(0), b * s, k, e, 0.01)
    # Megatron's sequence-level loss: [seqlen, batch * experts], counts per (sequence, expert).
    seq_scores = scores.transpose(0, 1).reshape(s, -1)
    seq_map = routing_map.transpose(0, 1).reshape(s, -1)
    seq = switch_loss(seq_scores, seq_map.sum(0), s, k, e, 0.02) / b
    z_all = torch.logsumexp(logits, -1).square()
    z = z_all.mean() * 0.001
    valid = tensor(c["valid"]).bool()
    z_valid = (z_all * valid).sum() / valid.sum().clamp(min=1) * 0.001
    (aux + 3 * seq + 5 * z + 7 * z_valid).backward()
    scalar = lambda mine, want: abs(mine - want.item()) / max(1.0, abs(want.item()))  # noqa: E731
    return "aux, sequence aux and z losses", {
        "aux": scalar(c["aux"], aux), "seq_aux": scalar(c["seq_aux"], seq),
        "z": scalar(c["z"], z), "z_valid": scalar(c["z_valid"], z_valid),
        "dlogits": rel_err(tensor(c["dlogits"]), logits.grad)}


def permute_mask(c):
    x = tensor(c["x"]).requires_grad_(True)
    probs = tensor(c["probs"]).requires_grad_(True)
    routing_map = tensor(c["routing_map"]).bool()
    tokens, experts = routing_map.shape
    # TE's pytorch_permute_mask_map: expert-major, token order within an expert.
    sorted_tokens = torch.arange(tokens).unsqueeze(0).expand(experts, -1).masked_select(
        routing_map.T.contiguous())
    permuted = x.index_select(0, sorted_tokens)
    permuted_probs = probs.T.contiguous().masked_select(routing_map.T.contiguous())
    rows = permuted * tensor(c["row_scale"])
    # pytorch_unpermute_mask_map with probs: rows times their probability, scatter-added back.
    merged = rows * permuted_probs.unsqueeze(-1)
    where = sorted_tokens.unsqueeze(1).expand(-1, x.shape[1])
    y = torch.zeros_like(x).scatter_add(0, where, merged)
    y_summed = torch.zeros_like(x).scatter_add(0, where, rows)
    torch.autograd.backward([y, permuted_probs], [tensor(c["dy"]), tensor(c["dpermuted_probs"])])
    return "permute with probs (mask map) and unpermute", {
        "permuted": rel_err(tensor(c["permuted"]), permuted.detach()),
        "permuted_probs": rel_err(tensor(c["permuted_probs"]), permuted_probs.detach()),
        "y": rel_err(tensor(c["y"]), y.detach()),
        "y_summed": rel_err(tensor(c["y_summed"]), y_summed.detach()),
        "dx": rel_err(tensor(c["dx"]), x.grad), "dprobs": rel_err(tensor(c["dprobs"]), probs.grad)}


def drop(c):
    probs, routing_map = tensor(c["probs"]), tensor(c["routing_map"]).bool()
    tokens, experts = probs.shape
    capacity = math.ceil((tokens * c["topk"] / experts) * c["capacity_factor"])
    keep = torch.ones_like(routing_map)
    if capacity <= tokens:
        best = torch.topk(probs, k=capacity, dim=0, sorted=False)[1]
        keep = torch.zeros_like(probs).scatter(0, best, 1).bool()
    kept_map = routing_map & keep
    return "capacity %d of %d tokens, drop_policy probs" % (capacity, tokens), {
        "kept_map": rel_err(tensor(c["kept_map"]), kept_map.double()),
        "kept_probs": rel_err(tensor(c["kept_probs"]), probs * kept_map)}


def sort_chunks(c):
    x = tensor(c["x"]).requires_grad_(True)
    chunks = torch.split(x, c["split_sizes"], dim=0)
    y = torch.cat([chunks[i] for i in c["sorted_index"]], dim=0)
    y.backward(tensor(c["dy"]))
    return "sort chunks %s by %s" % (c["split_sizes"], c["sorted_index"]), {
        "y": rel_err(tensor(c["y"]), y.detach()), "dx": rel_err(tensor(c["dx"]), x.grad)}


def permute_index(c):
    x = tensor(c["x"]).requires_grad_(True)
    merging = tensor(c["merging"]).requires_grad_(True)
    indices = tensor(c["indices"]).long()
    topk = indices.shape[1]
    flat = indices.view(-1)
    out = c["num_out_tokens"] or flat.numel()
    # TE's pytorch_permute_index_map: a stable sort of the flattened indices.
    order = torch.argsort(flat, stable=True)
    permuted = x.index_select(0, order[:out] // topk)
    rows = permuted * tensor(c["row_scale"])
    # pytorch_unpermute_index_map: rows back to their (token, k) slot, weighted, summed over k.
    slots = torch.zeros(flat.numel(), x.shape[1], dtype=x.dtype).index_copy(0, order[:out], rows)
    y = (slots.reshape(-1, topk, x.shape[1]) * merging.unsqueeze(-1)).sum(1)
    y.backward(tensor(c["dy"]))
    return "permute (index map, %d rows kept) and unpermute" % out, {
        "permuted": rel_err(tensor(c["permuted"]), permuted.detach()),
        "y": rel_err(tensor(c["y"]), y.detach()), "dx": rel_err(tensor(c["dx"]), x.grad),
        "dmerging": rel_err(tensor(c["dmerging"]), merging.grad)}


CHECKS = {"router": router, "aux_scores": aux_scores, "losses": losses,
          "permute_mask": permute_mask, "permute_index": permute_index, "drop": drop,
          "sort_chunks": sort_chunks}


def main(path):
    return run_cases(path, lambda c: CHECKS[c["kind"]](c),
                     "TE's and Megatron's MoE reference math (torch %s)" % torch.__version__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
