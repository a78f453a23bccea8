#!/usr/bin/python3
"""Reads a one-process te-cpp checkpoint with the Python safetensors package and compares every
tensor with the values the C++ side exported.

    check-safetensors.py CHECKPOINT_DIR EXPECTED_JSON

EXPECTED_JSON maps each tensor name to {"shape": [...], "values": [...]} (float32 values printed
with 9 significant digits, which round-trip exactly). Exits 0 when every tensor matches bit for
bit, 1 on a mismatch, 77 (skip) when the safetensors package is not installed (Debian 13 ships
python3-safetensors; Debian 12 does not).
"""
import json
import sys

try:
    import numpy as np
    from safetensors.numpy import load_file
except ImportError as e:
    print(f"check-safetensors: skipped, {e} (install python3-safetensors and python3-numpy)")
    sys.exit(77)


def main():
    ckpt, expected_path = sys.argv[1], sys.argv[2]
    tensors = load_file(f"{ckpt}/model.safetensors")
    expected = json.load(open(expected_path))
    bad = []
    for name, want in expected.items():
        if name not in tensors:
            bad.append(f"{name}: missing from model.safetensors")
            continue
        got = tensors[name]
        ref = np.asarray(want["values"], dtype=np.float32).reshape(want["shape"])
        if got.dtype != np.float32 or list(got.shape) != want["shape"]:
            bad.append(f"{name}: {got.dtype} {list(got.shape)}, expected float32 {want['shape']}")
        elif not np.array_equal(got.view(np.uint32), ref.view(np.uint32)):
            bad.append(f"{name}: values differ (max {np.abs(got - ref).max()})")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        bad.append(f"unexpected tensors: {extra}")
    for line in bad:
        print("check-safetensors:", line)
    print(f"check-safetensors: {len(expected) - len(bad)} of {len(expected)} tensors equal "
          f"(safetensors {__import__('safetensors').__version__})")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
