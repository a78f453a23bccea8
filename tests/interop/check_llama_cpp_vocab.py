"""Holds te::hf::Tokenizer::from_gguf to llama.cpp's vocab test vectors: the vocab-only GGUF files
llama.cpp keeps in models/ (ggml-vocab-NAME.gguf), each with texts (.inp) and the ids each model's
own Hugging Face tokenizer gives them without special tokens (.out, written by llama.cpp's
convert_hf_to_gguf_update.py with AutoTokenizer), from the llama.cpp that PyPI's
llama-cpp-python 0.3.36 sdist vendors (scripts/fetch_models.py llama-vocab). Every id of every
text must be equal for every file: the byte-level BPE families (tokenizer.ggml.pre names the
split: hf/src/tokenizer_gguf.cpp), the SentencePiece BPE ones (Llama 2's, Phi-3's), Gemma 4's BPE
and BERT's WordPiece.

  python check_llama_cpp_vocab.py BINARY WORKDIR [CACHE]   (CACHE: ~/.cache/te-cpp/models)
"""

import json
import os
import subprocess
import sys

from interop_common import MODEL_CACHE, fetch_models

BUILT = ["gpt-2", "llama-bpe", "qwen2", "qwen35", "deepseek-llm", "deepseek-coder", "starcoder",
         "falcon", "refact", "mpt", "command-r", "llama-spm", "phi-3", "gemma-4", "bert-bge"]
SEPARATOR = "\n__ggml_vocab_test__\n"  # llama.cpp's tests/test-tokenizer-0.cpp


def vectors(folder, name):
    """[(text, ids)] of ggml-vocab-NAME.gguf."""
    base = os.path.join(folder, "ggml-vocab-%s.gguf" % name)
    with open(base + ".inp", encoding="utf-8") as f:
        texts = f.read().split(SEPARATOR)
    if texts and texts[-1] == "":
        texts.pop()
    with open(base + ".out", encoding="utf-8") as f:
        lines = f.read().split("\n")
    ids = [[int(t) for t in line.split()] for line in lines[:len(texts)]]
    if len(ids) != len(texts):
        raise SystemExit("%s: %d texts but %d id lines" % (base, len(texts), len(ids)))
    return base, list(zip(texts, ids))


def run_te(binary, gguf, texts, workdir, name):
    inp = os.path.join(workdir, name + ".texts.json")
    out = os.path.join(workdir, name + ".out.json")
    with open(inp, "w") as f:
        json.dump(texts, f)
    r = subprocess.run([binary, "--tokenizer", gguf, "--texts", inp, "--out", out,
                        "--no-special"], capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip()
    with open(out) as f:
        return json.load(f)["ids"], ""


def main(binary, workdir, cache):
    os.makedirs(workdir, exist_ok=True)
    folder = fetch_models.fetch(fetch_models.MODELS["llama-vocab"], cache)
    failures = 0
    for name in BUILT:
        gguf, cases = vectors(folder, name)
        got, error = run_te(binary, gguf, [t for t, _ in cases], workdir, name)
        if got is None:
            print("FAIL %s: te refused it: %s" % (name, error))
            failures += 1
            continue
        bad = [(t, g, want) for (t, want), g in zip(cases, got) if g != want]
        print("%s %s: %d/%d texts, every id equal" % ("FAIL" if bad else "ok  ", name,
                                                     len(cases) - len(bad), len(cases)))
        for text, mine, want in bad[:3]:
            print("  %r\n    te        %s\n    llama.cpp %s" % (text[:60], mine, want))
        failures += bool(bad)
    print("%d of %d vocab files differ from llama.cpp's vectors" % (failures,
                                                                   len(BUILT)))
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else MODEL_CACHE))
