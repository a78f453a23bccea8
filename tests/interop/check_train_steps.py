"""Holds te's training step to PyTorch's, step by step: for random-config Llama and Qwen3 models
(Qwen3 with tied embeddings, as Qwen3-0.6B and SmolLM2 are) saved by transformers, te_interop_train
(tests/interop/train_steps.cpp) trains the model te::hf loads with te::optim::AdamW (norms and
biases out of weight decay), te::optim::LrSchedule (warmup, cosine decay to a floor),
te::optim::clip_grad_norm and gradient accumulation, the loss the mean over label tokens (some
labels -100, a different count in each row), all as te::train::LmTrainer steps; here the same
model is trained by
transformers with torch.optim.AdamW (foreach=False, two groups: parameters of fewer than two
dimensions or named *bias without decay), LambdaLR with torchtitan's linear_warmup_stable_decay
factor, torch.nn.utils.clip_grad_norm_ and the same batches.

A Qwen3-MoE model (4 experts, 2 per token) trains the same way with transformers' MoE loss (the
cross-entropy plus router_aux_loss_coef times the load-balancing loss over both layers'
routers), on the runs below and expert parallel too: EP2, DP2xEP2 and EP2xTP2.

Held, every step's loss and gradient norm (before clipping):
- te's float32 run on one process to PyTorch's float32 run: within 1e-5 relative;
- te's float32 runs with 4 micro-batches, on FSDP2, TP2, DP2xTP2, DP2xTP2 with 2
  micro-batches and DP2xTP2 with ZeRO-1 (AdamW's state split over the data axis) to te's
  one-process run: losses within 1e-6 relative, gradient norms within 3e-5
  (measured 7e-7 and 1.2e-5: float32 sums of the micro-batches' or the halves' gradients in another
  order, carried through 30 Adam steps at lr 5e-3, where they grow from ~1e-8 at the first
  step; the largest is Qwen3's tied model on TP2, whose attention is bit for bit each head's
  one-process result: its step-to-step spread moved from 6e-6 to 1.2e-5 when attention became
  te's fused kernel, with no layout difference of its own);
- the DP2xTP2 run's model exported by te::hf::save_causal_lm (config.json + model.safetensors),
  loaded by from_pretrained: its weights those PyTorch's run trained, within 1e-5;
- te's bfloat16 run with fp32 master weights to PyTorch's bfloat16 run with fp32 masters (the
  forward and backward in bf16, torch.optim.AdamW on fp32 copies of the weights fed the bf16
  gradients widened, the weights the masters rounded): within BF16_TOL relative. The two bf16
  forwards round differently (te's GEMMs and norms are not transformers' kernels), so this is a
  bound, not an equality (measured 1.1e-3; PyTorch's own bf16 run is 1.4e-3 from its float32
  run).

  python check_train_steps.py BINARY WORKDIR
"""

import json
import math
import os
import subprocess
import sys

import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

STEPS, BATCH, SEQ, VOCAB = 30, 4, 16, 128
SIZES = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
             rms_norm_eps=1e-6, attention_dropout=0.0, attn_implementation="eager")
# Expert-parallel runs, for the mixture of experts beside the layouts every case runs.
EP_RUNS = [
    dict(name="ep2", mesh=[2], axes=["data"], mesh_resource="dp=data,ep=data"),
    dict(name="dp2xep2", mesh=[2, 2], axes=["data", "expert"],
         mesh_resource="dp=data,ep=expert"),
    dict(name="ep2xtp2", mesh=[2, 2], axes=["data", "tp"], mesh_resource="dp=data,ep=data,tp=tp"),
]
CASES = [
    ("llama", LlamaConfig, LlamaForCausalLM, dict(tie_word_embeddings=False), []),
    ("qwen3_tied", Qwen3Config, Qwen3ForCausalLM, dict(tie_word_embeddings=True, head_dim=8), []),
    # 4 experts of 24, 2 per token, renormalised; the loss counts the routers' load-balancing loss
    # (output_router_logits, weighted 0.1), as transformers' own loss does.
    ("qwen3_moe", Qwen3MoeConfig, Qwen3MoeForCausalLM,
     dict(tie_word_embeddings=False, head_dim=8, num_experts=4, num_experts_per_tok=2,
          moe_intermediate_size=24, norm_topk_prob=True, output_router_logits=True,
          router_aux_loss_coef=0.1, experts_implementation="eager"), EP_RUNS),
]
SPEC = dict(lr=5e-3, betas=[0.9, 0.95], eps=1e-8, weight_decay=0.1, warmup=5,
            decay_type="cosine", lr_min=0.1, clip=1.0)
RUNS = [
    dict(name="one"),
    dict(name="one_acc4", micro_batches=4),
    dict(name="fsdp2", mesh=[2], axes=["fsdp"], mesh_resource="fsdp=fsdp"),
    dict(name="tp2", mesh=[2], axes=["tp"], mesh_resource="tp=tp"),
    dict(name="dp2xtp2", mesh=[2, 2], axes=["data", "tp"], mesh_resource="dp=data,tp=tp",
         export="export_dp2xtp2"),
    dict(name="dp2xtp2_acc2", mesh=[2, 2], axes=["data", "tp"], mesh_resource="dp=data,tp=tp",
         micro_batches=2),
    dict(name="dp2xtp2_zero1", mesh=[2, 2], axes=["data", "tp"], mesh_resource="dp=data,tp=tp",
         zero="data"),
    dict(name="one_bf16", dtype="bfloat16"),
]
TOL = 1e-5
LAYOUT_TOL = {"loss": 1e-6, "grad_norm": 3e-5}
BF16_TOL = 5e-3


def factor(step, steps, warmup, lr_min, decay_type):
    """torchtitan's linear_warmup_stable_decay (components/lr_scheduler.py) with the decay taking
    every step after the warmup, as LambdaLR applies it at optimizer step `step` (from 0)."""
    decay = steps - warmup
    if step < warmup:
        return (step + 1) / (warmup + 1)
    progress = (step + 1 - warmup) / (decay + 1)
    f = {"linear": 1 - progress, "sqrt": 1 - math.sqrt(progress),
         "cosine": 0.5 * (1 + math.cos(math.pi * progress))}[decay_type]
    return lr_min + (1 - lr_min) * f


def labels_of(rows):
    """te_interop_train's labels: the next tokens, -100 where (3 row + position^2) mod 7 is 0."""
    labels = rows[:, 1:].clone()
    row = torch.arange(rows.shape[0]).unsqueeze(1)
    pos = torch.arange(rows.shape[1] - 1).unsqueeze(0)
    labels[(row * 3 + pos * pos) % 7 == 0] = -100
    return labels


def reference(case_dir, batches, bf16, micro_batches=1):
    """PyTorch's run: losses and gradient norms per step, and the trained model. With
    micro_batches, each step's rows split in order into that many micro-batches, each
    micro-batch's summed losses over the step's label tokens backward in turn: the same as one
    batch for the cross-entropy, but the load-balancing loss (not a sum over tokens) is each
    micro-batch's, weighted by its label tokens, as te's LmTrainer takes it (the micro-batches'
    mean when their label tokens are equal, as Megatron scales each micro-batch's aux loss by
    1 / num_microbatches: megatron/core/pipeline_parallel/schedules.py at d98e8a64dd)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(case_dir, dtype=torch.float32,
                                                              attn_implementation="eager")
    model.train()
    named = list(model.named_parameters())
    no_decay = {n for n, p in named if p.ndim < 2 or n.endswith("bias")}
    masters = {n: p.detach().clone().float() for n, p in named} if bf16 else None
    if bf16:
        model.to(torch.bfloat16)
        named = list(model.named_parameters())
    stepped = {n: (masters[n].requires_grad_(True) if bf16 else p) for n, p in named}
    groups = [{"params": [stepped[n] for n, _ in named if n not in no_decay],
               "weight_decay": SPEC["weight_decay"]},
              {"params": [stepped[n] for n, _ in named if n in no_decay], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=SPEC["lr"], betas=tuple(SPEC["betas"]), eps=SPEC["eps"],
                            foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: factor(k, STEPS, SPEC["warmup"], SPEC["lr_min"], SPEC["decay_type"]))
    losses, norms = [], []
    router = getattr(model.config, "output_router_logits", False)
    for rows in batches:
        rows = torch.tensor(rows)
        labels = labels_of(rows)
        model.zero_grad(set_to_none=True)
        count = (labels != -100).sum()
        loss = 0.0
        for ids, marks in zip(rows[:, :-1].chunk(micro_batches), labels.chunk(micro_batches)):
            out = model(input_ids=ids)
            part = torch.nn.functional.cross_entropy(
                out.logits.float().reshape(-1, VOCAB), marks.reshape(-1), ignore_index=-100,
                reduction="sum")
            if router:  # transformers' loss: plus the weighted load-balancing loss of every layer
                part = part + model.config.router_aux_loss_coef * out.aux_loss * (marks != -100).sum()
            part = part / count
            part.backward()
            loss += part.item()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), SPEC["clip"])
        if bf16:
            for n, p in named:
                masters[n].grad = p.grad.float()
        opt.step()
        sched.step()
        if bf16:
            with torch.no_grad():
                for n, p in named:
                    p.copy_(masters[n])
        losses.append(loss)
        norms.append(norm.item())
    return {"loss": losses, "grad_norm": norms, "model": model}


def rel(a, b):
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def runs_of(extra_runs):
    """Every run of a case: RUNS with its own layouts before the bf16 run (the last)."""
    return RUNS[:-1] + extra_runs + RUNS[-1:]


def make_case(workdir, name, config_class, model_class, extra, extra_runs):
    torch.manual_seed(0)
    config = config_class(**SIZES, **extra)
    model = model_class(config).eval()
    with torch.no_grad():  # norm scales off their initial ones
        for n, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    case_dir = os.path.join(workdir, name)
    model.save_pretrained(case_dir)
    # Learnable text: each row from a random token on, token -> (5 token + 3) mod VOCAB, so the
    # loss falls steadily (on random ids it wanders, and Adam amplifies rounding differences).
    g = torch.Generator().manual_seed(1)
    first = torch.randint(0, VOCAB, (STEPS, BATCH), generator=g)
    rows = [first]
    for _ in range(SEQ - 1):
        rows.append((rows[-1] * 5 + 3) % VOCAB)
    batches = torch.stack(rows, dim=-1).tolist()
    with open(os.path.join(case_dir, "run.json"), "w") as f:
        runs = [dict(r, export=os.path.join(case_dir, r["export"])) if "export" in r else r
                for r in runs_of(extra_runs)]
        json.dump(dict(SPEC, batches=batches, runs=runs), f)
    return case_dir, batches


def check(binary, workdir, case):
    name = case[0]
    case_dir, batches = make_case(workdir, *case)
    out = os.path.join(case_dir, "te.json")
    subprocess.run([binary, "--model", case_dir, "--run", os.path.join(case_dir, "run.json"),
                    "--out", out], check=True)
    te = json.load(open(out))["runs"]
    want = reference(case_dir, batches, bf16=False)
    router = case[3].get("output_router_logits", False)
    errors = {}
    for what in ("loss", "grad_norm"):
        errors["one/pytorch %s" % what] = (rel(te["one"][what], want[what]), TOL)
        for run in runs_of(case[-1])[1:-1]:
            if router and run.get("micro_batches", 1) > 1:
                continue  # not one batch's loss: held to PyTorch's accumulation below
            errors["%s/one %s" % (run["name"], what)] = (rel(te[run["name"]][what],
                                                             te["one"][what]), LAYOUT_TOL[what])
    # The load-balancing loss taken per micro-batch: each accumulating run held to PyTorch's
    # run with its micro-batches.
    for run in runs_of(case[-1]):
        if router and run.get("micro_batches", 1) > 1:
            acc = reference(case_dir, batches, bf16=False, micro_batches=run["micro_batches"])
            for what in ("loss", "grad_norm"):
                errors["%s/pytorch %s" % (run["name"], what)] = (rel(te[run["name"]][what],
                                                                     acc[what]), TOL)
    want_bf16 = reference(case_dir, batches, bf16=True)
    errors["one_bf16/pytorch_bf16 loss"] = (rel(te["one_bf16"]["loss"], want_bf16["loss"]),
                                            BF16_TOL)
    # A bf16 run, not an fp32 one passed off as it: as far from te's fp32 run as PyTorch's are.
    errors["1e-4/(one_bf16 vs one loss)"] = (
        1e-4 / max(rel(te["one_bf16"]["loss"], te["one"]["loss"]), 1e-12), 1.0)
    # The DP2xTP2 run's model exported by te::hf::save_causal_lm, loaded by transformers: the
    # weights PyTorch's run trained (a tied head included).
    exported = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(case_dir, "export_dp2xtp2"), dtype=torch.float32)
    trained = dict(want["model"].named_parameters())
    loaded = dict(exported.named_parameters())
    if set(loaded) != set(trained):
        errors["export names"] = (1.0, 0.0)
    errors["export/pytorch weights"] = (max(
        (loaded[n].detach() - p.detach()).abs().max().item() / max(1.0, p.abs().max().item())
        for n, p in trained.items() if n in loaded), TOL)
    bad = {k: e for k, (e, tol) in errors.items() if not e <= tol}
    print("%s %s: %s" % ("FAIL" if bad else "ok  ", name,
                         ", ".join("%s %.2g" % (k, e) for k, (e, _) in errors.items())))
    print("     losses: pytorch %.4f -> %.4f, te %.4f -> %.4f" %
          (want["loss"][0], want["loss"][-1], te["one"]["loss"][0], te["one"]["loss"][-1]))
    return not bad


def main():
    binary, workdir = sys.argv[1], sys.argv[2]
    os.makedirs(workdir, exist_ok=True)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    failures = sum(not check(binary, workdir, c) for c in CASES)
    print("%d of %d models train differently from PyTorch (tolerance %g; bf16 %g)" %
          (failures, len(CASES), TOL, BF16_TOL))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
