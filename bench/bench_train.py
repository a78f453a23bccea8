"""te-train's training throughput against the same training in PyTorch eager, same threads.

What it measures: tokens/s of a Llama-family causal LM trained from random weights, one
optimizer step per micro-batch (forward, backward, global gradient clipping at 1.0, AdamW with
betas (0.9, 0.95) and weight decay 0.1 on the matrices, none on the norms), B rows x S tokens a
step, in fp32 and bf16, on T intra-op threads (default 2):

- te: build/examples/train/te-train (LibTorch + te-cpp) on a model folder this program writes
  (config.json + model.safetensors from transformers' save_pretrained, float32, random init, and
  a byte-level BPE tokenizer.json copied from fuzz/corpus/tokenizer/), trained on a text corpus
  made of the repository's README.md and docs/*.md. Its per-step CSV (--log-steps) gives each
  step's tokens/s; the step time excludes the data loading, as the PyTorch timing does.
- PyTorch: the same folder through transformers' AutoModelForCausalLM.from_pretrained with
  attn_implementation "sdpa" (PyTorch's default; --attn eager for the other), model.train(),
  torch.set_num_threads(T), next-token cross-entropy (logits upcast to float32, as transformers'
  own loss does) over B x S token ids drawn uniformly from the tokenizer's ids, the labels the
  next ids (S labels a row, as te-train's blocks); each step times forward, backward,
  clip_grad_norm_(1.0), AdamW.step() (foreach, PyTorch's CPU default) and zero_grad() with
  time.perf_counter. bf16 (as te-train: bf16 weights and activations, float32 master weights in
  AdamW): the model in bf16 for forward and backward, a float32 copy of every parameter that
  gets the upcast gradients, is clipped and stepped by AdamW, and is copied back into the bf16
  weights (--torch-bf16 pure: AdamW directly on the bf16 parameters, no masters).

Both run one after the other, never at once (te-train a child process, PyTorch in this one), and
each reports the median step time over the steps after the first --warmup (default 2); with
--rounds N they alternate N times and the medians of the rounds are reported. Tokens/s is
B x S / that median; the ratio is te / PyTorch (above 1: te is faster).

The issue holds te-train to >= 1.1x PyTorch 2.11 eager in fp32 and bf16 (the goal 1.2x). This
program reports the ratios against those numbers; it asserts nothing (timings are never test
assertions).

  build/venv-cuda/bin/python bench/bench_train.py                      # SmolLM2-135M's shape
  build/venv-cuda/bin/python bench/bench_train.py --preset small --steps 6 --seq-len 64 \\
      --micro-batch 2                                                   # a quick run
  options: --preset smollm2|small --dtypes fp32,bf16 --steps N --warmup 2 --seq-len S
           --micro-batch B --threads T --rounds R --attn sdpa|eager --torch-bf16 master|pure
           --te-train PATH --workdir DIR --json FILE
"""

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

TOKENIZER = os.path.join(ROOT, "fuzz", "corpus", "tokenizer", "tokenizer-bpe.json")
EOS_ID = 0  # <|endoftext|> of that tokenizer

PRESETS = {
    # SmolLM2-135M's architecture (HuggingFaceTB/SmolLM2-135M config.json), random weights.
    "smollm2": dict(
        hidden_size=576,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
        vocab_size=49152,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
    ),
    "small": dict(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=704,
        vocab_size=8192,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
    ),
}


def log(msg):
    print("bench_train: " + msg, file=sys.stderr, flush=True)


def write_model(preset, folder):
    """A random-init float32 Llama in `folder` (config, safetensors, tokenizer.json)."""
    os.makedirs(folder, exist_ok=True)
    p = dict(PRESETS[preset])
    rope_theta = p.pop("rope_theta")
    config = transformers.LlamaConfig(
        **p,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=EOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=None,
    )
    # transformers 5 keeps rope_theta in rope_parameters; older ones read the attribute.
    config.rope_parameters = {"rope_type": "default", "rope_theta": rope_theta}
    config.rope_theta = rope_theta
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(folder)
    del model
    shutil.copyfile(TOKENIZER, os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token_id": EOS_ID, "eos_token_id": EOS_ID}, f)


def tokenizer_vocab_size():
    import tokenizers

    return tokenizers.Tokenizer.from_file(TOKENIZER).get_vocab_size()


def write_corpus(path, tokens_needed):
    """README.md and docs/*.md, repeated until they hold `tokens_needed` tokens (counted with the
    same tokenizer) twice over; documents are separated by blank lines."""
    import tokenizers

    sources = [os.path.join(ROOT, "README.md")]
    docs = os.path.join(ROOT, "docs")
    sources += sorted(os.path.join(docs, n) for n in os.listdir(docs) if n.endswith(".md"))
    text = "\n\n".join(open(s, encoding="utf-8").read().strip() for s in sources) + "\n"
    tok = tokenizers.Tokenizer.from_file(TOKENIZER)
    per_copy = max(1, len(tok.encode(text).ids))
    copies = max(1, -(-2 * tokens_needed // per_copy))
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(copies):
            f.write(text + "\n")
    return copies * per_copy


def median_seconds(step_seconds, warmup):
    timed = step_seconds[warmup:]
    if not timed:
        raise SystemExit("bench_train: no timed step: give --steps above --warmup")
    return statistics.median(timed)


def run_te(a, folder, corpus, dtype, workdir):
    """te-train's per-step seconds (from its --log-steps CSV), its losses, and its memory: the
    most tensor bytes a step held against te-train --plan's figure (from --metrics-json)."""
    csv_path = os.path.join(workdir, f"te-{dtype}-steps.csv")
    metrics = os.path.join(workdir, f"te-{dtype}-metrics.json")
    for p in (csv_path, metrics):
        if os.path.exists(p):
            os.remove(p)
    cmd = [
        a.te_train, "--model", folder, "--data", corpus, "--steps", str(a.steps),
        "--seq-len", str(a.seq_len), "--micro-batch", str(a.micro_batch), "--dtype", dtype,
        "--lr", "1e-4", "--warmup", "0", "--clip", "1", "--weight-decay", "0.1",
        "--beta1", "0.9", "--beta2", "0.95", "--threads", str(a.threads), "--quiet",
        "--log-steps", csv_path, "--metrics-json", metrics,
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(
            f"bench_train: te-train failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}{r.stderr}"
        )
    tokens = a.micro_batch * a.seq_len
    seconds, losses = [], []
    with open(csv_path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            seconds.append(tokens / float(row["tokens_per_second"]))
            losses.append(float(row["loss"]))
    if len(seconds) != a.steps:
        raise SystemExit(f"bench_train: {csv_path} holds {len(seconds)} steps, not {a.steps}")
    with open(metrics, encoding="utf-8") as f:
        m = json.load(f)
    return seconds, losses, (m["peak_bytes"], m["planned_peak_bytes"])


class TorchPeer:
    """The same training in PyTorch eager: one model and optimizer per dtype, kept across
    rounds."""

    def __init__(self, a, folder, dtype, vocab_ids):
        self.a, self.dtype, self.vocab_ids = a, dtype, vocab_ids
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, attn_implementation=a.attn
        )
        self.vocab = model.config.vocab_size
        self.master = None
        if dtype == "bf16" and a.torch_bf16 == "master":
            self.master = [p.detach().clone().float() for p in model.parameters()]
            for m, p in zip(self.master, model.parameters()):
                m.requires_grad_(p.requires_grad)
        if dtype == "bf16":
            model = model.to(torch.bfloat16)
        model.train()
        self.model = model
        params = self.master if self.master is not None else list(model.parameters())
        # te-train's AdamW decays the matrices, not the norms (1-D) nor biases.
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
            lr=1e-4,
            betas=(0.9, 0.95),
        )
        self.gen = torch.Generator().manual_seed(0)

    def batch(self):
        a = self.a
        ids = torch.randint(0, self.vocab_ids, (a.micro_batch, a.seq_len + 1), generator=self.gen)
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def step(self, ids, labels):
        model = self.model
        logits = model(input_ids=ids, use_cache=False).logits
        loss = F.cross_entropy(logits.float().view(-1, self.vocab), labels.view(-1))
        loss.backward()
        if self.master is None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        else:
            for m, p in zip(self.master, model.parameters()):
                m.grad = None if p.grad is None else p.grad.float()
            torch.nn.utils.clip_grad_norm_(self.master, 1.0)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            model.zero_grad(set_to_none=True)
            with torch.no_grad():
                for m, p in zip(self.master, model.parameters()):
                    p.copy_(m)
        return loss.item()

    def run(self):
        seconds, losses = [], []
        for _ in range(self.a.steps):
            ids, labels = self.batch()  # drawn outside the timing, as te-train's data
            start = time.perf_counter()
            losses.append(self.step(ids, labels))
            seconds.append(time.perf_counter() - start)
        return seconds, losses


def main():
    parser = argparse.ArgumentParser(usage=__doc__)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="smollm2")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--steps", type=int, default=8, help="steps a run, --warmup included")
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the median")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="te then PyTorch, this many times")
    parser.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    parser.add_argument("--torch-bf16", choices=["master", "pure"], default="master")
    parser.add_argument(
        "--te-train", default=os.path.join(ROOT, "build", "examples", "train", "te-train")
    )
    parser.add_argument("--workdir", default=os.path.join(ROOT, "build", "bench_train"))
    parser.add_argument("--json", help="also write the results here")
    a = parser.parse_args()
    dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    for d in dtypes:
        if d not in ("fp32", "bf16"):
            parser.error(f"--dtypes: {d} is not fp32 or bf16")
    if a.steps <= a.warmup:
        parser.error("--steps must be above --warmup")
    if not os.access(a.te_train, os.X_OK):
        parser.error(f"--te-train: {a.te_train} is not an executable (build examples/train)")

    torch.set_num_threads(a.threads)
    os.makedirs(a.workdir, exist_ok=True)
    folder = os.path.join(a.workdir, f"model-{a.preset}")
    log(f"writing a random {a.preset} model to {folder}")
    write_model(a.preset, folder)
    corpus = os.path.join(a.workdir, "corpus.txt")
    corpus_tokens = write_corpus(corpus, a.steps * a.micro_batch * (a.seq_len + 1) + 1)
    vocab_ids = tokenizer_vocab_size()
    log(f"corpus {corpus}: about {corpus_tokens} tokens")

    tokens = a.micro_batch * a.seq_len
    results = []
    for dtype in dtypes:
        peer = TorchPeer(a, folder, dtype, vocab_ids)
        te_medians, torch_medians = [], []
        te_loss = torch_loss = None
        for r in range(a.rounds):
            log(f"{dtype} round {r + 1}/{a.rounds}: te-train, {a.steps} steps")
            s, losses, memory = run_te(a, folder, corpus, dtype, a.workdir)
            te_medians.append(median_seconds(s, a.warmup))
            te_loss = te_loss if te_loss is not None else losses[0]
            log(f"{dtype} round {r + 1}/{a.rounds}: PyTorch, {a.steps} steps")
            s, losses = peer.run()
            torch_medians.append(median_seconds(s, a.warmup))
            torch_loss = torch_loss if torch_loss is not None else losses[0]
        del peer
        te_tps = tokens / statistics.median(te_medians)
        torch_tps = tokens / statistics.median(torch_medians)
        results.append(
            dict(
                dtype=dtype,
                preset=a.preset,
                micro_batch=a.micro_batch,
                seq_len=a.seq_len,
                threads=a.threads,
                te_tokens_per_second=te_tps,
                torch_tokens_per_second=torch_tps,
                ratio_te_over_torch=te_tps / torch_tps,
                te_step_seconds_rounds=te_medians,
                torch_step_seconds_rounds=torch_medians,
                te_first_loss=te_loss,
                te_peak_bytes=memory[0],
                te_planned_peak_bytes=memory[1],
                torch_first_loss=torch_loss,
            )
        )

    print(
        f"te-train vs PyTorch {torch.__version__} eager ({a.attn} attention; bf16: "
        f"{'fp32 masters' if a.torch_bf16 == 'master' else 'bf16 AdamW, no masters'}), "
        f"transformers {transformers.__version__}, {a.threads} threads, median of steps "
        f"{a.warmup + 1}..{a.steps}, {a.rounds} round(s)"
    )
    print("| dtype | model | batch x seq | te tokens/s | torch tokens/s | te/torch |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['dtype']} | {r['preset']} | {r['micro_batch']} x {r['seq_len']} | "
            f"{r['te_tokens_per_second']:.0f} | {r['torch_tokens_per_second']:.0f} | "
            f"**{r['ratio_te_over_torch']:.2f}** |"
        )
    print("The issue's bar: te/torch >= 1.1 in fp32 and bf16 (goal 1.2); reported, not asserted.")
    print(
        "te-train's step peak (tensor bytes) against te-train --plan (the bar: within 10%): "
        + ", ".join(
            f"{r['dtype']} {r['te_peak_bytes'] / 2**20:.1f} MiB measured, "
            f"{r['te_planned_peak_bytes'] / 2**20:.1f} MiB planned "
            f"({r['te_planned_peak_bytes'] / r['te_peak_bytes']:.3f}x)"
            for r in results
        )
    )
    print(
        "first-step losses (random init, about ln(vocab)): "
        + ", ".join(
            f"{r['dtype']} te {r['te_first_loss']:.3f} torch {r['torch_first_loss']:.3f}"
            for r in results
        )
    )
    if a.json:
        info = dict(
            torch=torch.__version__,
            transformers=transformers.__version__,
            attn=a.attn,
            torch_bf16=a.torch_bf16,
            steps=a.steps,
            warmup=a.warmup,
            rounds=a.rounds,
            results=results,
        )
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(info, f, indent=2)


if __name__ == "__main__":
    main()
