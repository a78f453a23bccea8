"""Holds te::hf's GGUF reader (te_interop_gguf) to gguf-py, ggml's own Python package: a file
written by gguf-py's GGUFWriter with a tensor of every type te-cpp reads (F32, F16, BF16, Q8_0,
Q4_0, Q4_1 quantized by gguf-py from random values; Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
IQ4_NL and IQ4_XS as random blocks with finite scales: every bit pattern of their values; MXFP4
the same, its E8M0 scale bytes from 0 and 1 (ggml's subnormal halves 2^-128, 2^-127) to 250), 1-, 2- and 3-dim, and metadata of every value kind. Each tensor, whole and one box of
it, must equal gguf.quants.dequantize's values (float32: within 1e-6 relative), and every
metadata value what was written.

  python check_gguf.py BINARY WORKDIR
"""

import json
import os
import subprocess
import sys

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

TOL = 1e-6


# Where each type keeps its float16 scales in a block: (byte offset, how many).
SCALES = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208, 1), Q.Q2_K: (80, 2), Q.Q3_K: (108, 1),
          Q.Q5_0: (0, 1), Q.Q5_1: (0, 2), Q.IQ4_NL: (0, 1), Q.IQ4_XS: (0, 1)}


def random_blocks(rng, qtype, rows, blocks):
    """Random bytes for `rows` rows of `blocks` blocks of `qtype`, with finite float16 scales:
    every bit pattern of the quantized values, scale bits and masks."""
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, size=(rows, blocks, size), dtype=np.uint8)
    if qtype == Q.MXFP4:  # E8M0 scales: the subnormal halves, the middle, near the top
        scales = np.array([0, 1, 2, 3] + list(range(96, 160)) + [200, 250], dtype=np.uint8)
        raw[..., 0] = scales[np.arange(rows * blocks) % len(scales)].reshape(rows, blocks)
        return raw.reshape(rows, blocks * size)
    at, n = SCALES[qtype]
    raw[..., at:at + 2 * n] = rng.uniform(0.001, 0.1, size=(rows, blocks, n)).astype(
        np.float16).view(np.uint8)
    return raw.reshape(rows, blocks * size)


def write_file(path):
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(path, "llama")
    meta = {"te.u32": 7, "te.f32": 0.25, "te.text": "héllo", "te.bool": True}
    w.add_uint32("te.u32", 7)
    w.add_float32("te.f32", 0.25)
    w.add_string("te.text", "héllo")
    w.add_bool("te.bool", True)
    w.add_array("te.strings", ["a", "", "ü"])
    w.add_array("te.ints", [1, -2, 3])
    meta.update({"te.strings": ["a", "", "ü"], "te.ints": [1, -2, 3]})
    written = {}
    for qtype, shape in [(Q.F32, (5,)), (Q.F32, (4, 40)), (Q.F16, (3, 70)), (Q.BF16, (3, 64)),
                         (Q.Q8_0, (4, 96)), (Q.Q8_0, (2, 3, 64)), (Q.Q4_0, (4, 96)),
                         (Q.Q4_1, (4, 96)), (Q.Q4_K, (4, 768)), (Q.Q6_K, (3, 768)),
                         (Q.Q5_0, (4, 96)), (Q.Q5_1, (3, 64)), (Q.IQ4_NL, (2, 128)),
                         (Q.Q2_K, (3, 512)), (Q.Q3_K, (3, 768)), (Q.Q5_K, (2, 512)),
                         (Q.IQ4_XS, (3, 512)), (Q.MXFP4, (5, 32 * 52))]:
        name = "%s.%s" % (qtype.name, "x".join(map(str, shape)))
        if qtype in SCALES or qtype == Q.MXFP4:
            rows = int(np.prod(shape[:-1]))
            raw = random_blocks(rng, qtype, rows, shape[-1] // gguf.GGML_QUANT_SIZES[qtype][0])
        else:
            values = rng.standard_normal(shape).astype(np.float32)
            raw = gguf.quants.quantize(values, qtype)
        if qtype in (Q.F32, Q.F16):
            w.add_tensor(name, raw)
        else:
            w.add_tensor(name, raw.view(np.uint8), raw_dtype=qtype)
        want = gguf.quants.dequantize(raw.view(np.uint8) if qtype not in (Q.F32, Q.F16) else raw,
                                      qtype).astype(np.float32).reshape(shape)
        written[name] = (qtype, want)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written, meta


def err(mine, want, qtype):
    """The largest difference over the largest value (over 1 at least); MXFP4's values, whose
    scales span 2^-128 to 2^122, each over itself."""
    if qtype == Q.MXFP4:
        want = want.astype(np.float64)  # (1e-300 is 0 in float32)
        return float((np.abs(mine - want) / np.maximum(np.abs(want), 1e-300)).max())
    return float(np.abs(mine - want).max()) / max(1.0, float(np.abs(want).max()))


def main(binary, workdir):
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "all_types.gguf")
    out = os.path.join(workdir, "te.json")
    written, meta = write_file(path)
    subprocess.run([binary, path, out], check=True)
    te = json.load(open(out))
    failures = 0
    for name, (qtype, want) in written.items():
        t = te["tensors"].get(name)
        if t is None:
            print("FAIL %s: te read no such tensor" % name)
            failures += 1
            continue
        whole = np.array(t["whole"]["values"], dtype=np.float64).reshape(t["whole"]["shape"])
        box = np.array(t["box"]["values"], dtype=np.float64).reshape(t["box"]["shape"])
        index = tuple(slice(a, b) for a, b in zip(t["lo"], t["hi"]))
        e = {"whole": err(whole, want, qtype),
             "box %s" % ",".join("%d:%d" % b for b in zip(t["lo"], t["hi"])):
                 err(box, want[index], qtype)}
        bad = t["type"] != int(qtype) or not all(v <= TOL for v in e.values())
        failures += bad
        print("%s %s (%s): %s" % ("FAIL" if bad else "ok  ", name, qtype.name,
                                   ", ".join("%s %.2g" % kv for kv in e.items())))
    for key, value in meta.items():
        mine = te["metadata"].get(key)
        same = mine == value if not isinstance(value, float) else abs(mine - value) < 1e-7
        failures += not same
        print("%s metadata %s: %r (wrote %r)" % ("ok  " if same else "FAIL", key, mine, value))
    print("%d of %d differ from gguf-py %s (tolerance %g)" %
          (failures, len(written) + len(meta), "0.19.0", TOL))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
