"""Holds te's GGUF loading to transformers on the files llama.cpp's own tools make: for each
family (FAMILIES) a random-config float32 *ForCausalLM from transformers, saved with
save_pretrained beside a small SentencePiece tokenizer.model, converted to an F16 GGUF by
llama.cpp's convert_hf_to_gguf.py and quantized by llama.cpp's llama-quantize into each mix of
MIXES, both from the llama.cpp that PyPI's llama-cpp-python 0.3.36 sdist vendors (the one
scripts/llama-cpp.sh builds llama-server from: `--source` gives the converter and its gguf-py,
`llama-quantize` the quantizer; built once, ~10 minutes on 2 cores). Each file is then run by

  BINARY --model WORKDIR/<family>/<MIX>.gguf --ids WORKDIR/<family>/ids-<N>.json --out ...
         --logits-only

on every layout it writes (one process, TP2 and DP2xTP2 with the weights dequantized to float32,
and "one-blocks": the file as te loads it by default, its quantized weights held in their
blocks, whose held_blocks must not be 0), for two batches of ids (ROWS): 2 x 12 tokens, whose
24 rows take te's panel GEMM (blocks decoded into float32 panels), and 2 x 4, whose 8 rows
multiply the blocks directly (te::ggml::dot_rows; modules/src/block_weights.cpp kDirectRows).
Every layout's logits are held to what transformers loads from the same file
(check_hf_models.from_gguf: gguf-py's dequantization) within GGUF_TOL relative
(interop_common.rel_err).

The model sizes make llama-quantize write the types a real file of each mix holds, fallbacks
included: rows of hidden_size 256 are whole 256-wide k-quant super-blocks, ffn_down's rows of
intermediate_size 640 are not, nor is any row of the Mistral's hidden_size 192, so
llama-quantize falls back there to a 32-wide type (Q4_0, Q5_0, Q5_1, Q8_0, IQ4_NL). Each
file's tensor types (gguf.GGUFReader) are held to expected_type, which restates llama-quant.cpp's
choices for these tensors and sizes, and their counts are printed per mix.

  python check_gguf_mixes.py BINARY WORKDIR
"""

import collections
import io
import json
import os
import shutil
import subprocess
import sys

os.environ.setdefault("TQDM_DISABLE", "1")

import gguf
import numpy as np
import torch
import transformers
from check_hf_models import build, from_gguf, token_ids
from gguf import GGMLQuantizationType as Q
from interop_common import GGUF_TOL, print_failure, rel_err
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

try:
    import sentencepiece
except ImportError:
    raise SystemExit("check_gguf_mixes: %s has no sentencepiece, which llama.cpp's "
                     "convert_hf_to_gguf.py needs; bash scripts/cuda-libtorch.sh makes the venv "
                     "with it (its pins)" % sys.executable)

HERE = os.path.dirname(os.path.abspath(__file__))
LLAMA_CPP_SH = os.path.join(HERE, "..", "..", "scripts", "llama-cpp.sh")

# The mixes (llama-quantize's names for them, tools/quantize/quantize.cpp QUANT_OPTIONS).
MIXES = ["Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "IQ4_XS", "IQ4_NL"]

LAYERS = 3
# Tokens per row of the two batches of 2 rows (see the docstring): 24 rows and 8 rows.
ROWS = [12, 4]
# The order te_interop_hf_model's layouts are printed in.
LAYOUT_ORDER = {"one": 0, "tp2": 1, "dp2xtp2": 2, "one-blocks": 3}
SIZES = dict(vocab_size=320, hidden_size=256, num_hidden_layers=LAYERS, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=640, max_position_embeddings=64,
             rms_norm_eps=1e-6, attention_dropout=0.0, attn_implementation="eager")

# (case, config class, model class, config arguments beyond SIZES). The families te-cpp loads
# from GGUF (hf/src/families/: "llama", "qwen2", "qwen3"; a Mistral converts to "llama") that
# convert_hf_to_gguf.py and transformers 5.23.0's GGUF loader (integrations/ggml.py
# GGUF_CONFIG_MAPPING) both have. GPT-2 is left out: te-cpp reads no GPT-2 GGUF file.
FAMILIES = [
    # 8 query heads of 32 for 2 key/value heads (TP2 splits both): n_gqa 4, which moves attn_v's
    # type in Q2_K, IQ4_XS and IQ4_NL.
    ("llama", LlamaConfig, LlamaForCausalLM,
     dict(tie_word_embeddings=False, num_attention_heads=8)),
    # convert_hf_to_gguf.py writes a Mistral as a "llama" file (conversion/llama.py LlamaModel),
    # general.name "Mistral" (the folder's name), which transformers loads as a
    # LlamaForCausalLM: it takes a llama file as Mistral only where general.name is exactly
    # "mistral" (modeling_gguf_pytorch_utils.py load_gguf_checkpoint), and then fails
    # (get_gguf_hf_weights_map: gguf-py 0.19.0 has no "mistral" architecture). No window is
    # written. hidden_size 192: no row but ffn_down's (512) is whole 256-wide super-blocks, so
    # every k-quant falls back as in SmolLM2-135M's files (hidden 576).
    ("mistral", MistralConfig, MistralForCausalLM,
     dict(tie_word_embeddings=False, hidden_size=192, intermediate_size=512)),
    # Tied: token_embd.weight is also the output, and llama-quantize gives it the output's type.
    ("qwen2", Qwen2Config, Qwen2ForCausalLM, dict(tie_word_embeddings=True,
                                                   use_sliding_window=False)),
    # head_dim 128, not hidden_size / heads (64): qwen3.attention.key_length. transformers
    # 5.23.0 reads no key_length for qwen3 (integrations/ggml.py GGUF_CONFIG_MAPPING) and builds
    # Qwen3Config's default head_dim, 128, so only that size loads there.
    ("qwen3", Qwen3Config, Qwen3ForCausalLM, dict(tie_word_embeddings=False, head_dim=128)),
]

# What a mix's file type defaults to (llama-quant.cpp llama_ftype_get_default_type).
DEFAULT_TYPE = {"Q2_K": Q.Q2_K, "Q3_K_M": Q.Q3_K, "Q4_K_M": Q.Q4_K, "Q5_K_M": Q.Q5_K,
                "Q6_K": Q.Q6_K, "Q8_0": Q.Q8_0, "IQ4_XS": Q.IQ4_XS, "IQ4_NL": Q.IQ4_NL}

# Where a type goes when a row is not whole blocks of it (llama-quant.cpp
# tensor_type_fallback); a 32-wide type stays.
FALLBACK = {Q.Q2_K: Q.Q4_0, Q.Q3_K: Q.Q4_0, Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0,
            Q.IQ4_XS: Q.IQ4_NL}


def use_more_bits(i, n):
    """llama-quant.cpp's use_more_bits: the layers a mix gives a larger type."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def expected_type(mix, name, row, n_gqa, tied):
    """The type llama-quantize (llama-cpp-python 0.3.36's src/llama-quant.cpp,
    llama_tensor_get_type_impl then tensor_type_fallback) gives tensor `name` of a dense
    Llama/Qwen model of LAYERS layers, no imatrix, with rows `row` values wide; None for a tensor
    it leaves as it is (1-dim, the norms)."""
    if not name.endswith(".weight") or name.endswith("_norm.weight"):
        return None
    default = DEFAULT_TYPE[mix]
    kind = name.split(".")[-2]
    layer = int(name.split(".")[1]) if name.startswith("blk.") else None
    t = default
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        # The output (and a tied embedding): Q8_0 where the rows are not whole blocks of the
        # mix's type, else Q6_K unless the mix is Q8_0.
        t = Q.Q8_0 if row % gguf.GGML_QUANT_SIZES[default][0] or default == Q.Q8_0 else Q.Q6_K
    elif kind == "attn_v":  # counted per layer: i_attention_wv is the layer here
        if mix == "Q2_K":
            t = Q.Q4_K if n_gqa >= 4 else Q.Q3_K
        elif mix == "Q3_K_M":
            t = Q.Q5_K if layer < 2 else Q.Q4_K
        elif mix in ("IQ4_NL", "IQ4_XS") and n_gqa >= 4:
            t = Q.Q5_K
        elif mix in ("Q4_K_M", "Q5_K_M") and use_more_bits(layer, LAYERS):
            t = Q.Q6_K
    elif kind == "ffn_down":
        if mix == "Q2_K":
            t = Q.Q3_K
        elif mix == "Q3_K_M":
            t = Q.Q5_K if layer < LAYERS // 16 else Q.Q4_K
        elif mix in ("Q4_K_M", "Q5_K_M") and use_more_bits(layer, LAYERS):
            t = Q.Q6_K
        elif mix in ("IQ4_NL", "IQ4_XS") and layer < LAYERS // 8:
            t = Q.Q5_K
    elif kind == "attn_output":
        t = {"Q2_K": Q.Q3_K, "Q3_K_M": Q.Q4_K}.get(mix, t)
    if row % gguf.GGML_QUANT_SIZES[t][0]:
        t = FALLBACK.get(t, t)
        if row % gguf.GGML_QUANT_SIZES[t][0]:
            t = Q.F16
    return t


def spm_tokenizer():
    """A small SentencePiece BPE model (tokenizer.model's bytes): convert_hf_to_gguf.py takes a
    Llama's, Mistral's or Qwen's vocabulary from one (TextModel._set_vocab_sentencepiece) before
    trying tokenizer.json, whose byte-level BPE it accepts only for pre-tokenizers it knows by
    hash. 200 pieces; the converter pads the vocabulary to vocab_size."""
    gen = torch.Generator().manual_seed(0)
    words = ["w%d" % i for i in range(400)]
    lines = [" ".join(words[j] for j in torch.randint(0, 400, (12,), generator=gen).tolist())
             for _ in range(2000)]
    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=out, vocab_size=200, model_type="bpe",
        normalization_rule_name="identity", num_threads=1, minloglevel=2)
    return out.getvalue()


def llama_cpp():
    """(convert_hf_to_gguf.py, llama-quantize): scripts/llama-cpp.sh's vendored tree and build
    (made on the first call; its progress goes to stderr)."""
    try:
        out = subprocess.run(["bash", LLAMA_CPP_SH, "--source", "llama-quantize"], check=True,
                             stdout=subprocess.PIPE, text=True).stdout.split()
    except subprocess.CalledProcessError as e:
        raise SystemExit("check_gguf_mixes: %s --source llama-quantize exited with status %d"
                         % (LLAMA_CPP_SH, e.returncode))
    return os.path.join(out[0], "convert_hf_to_gguf.py"), out[1]


def run(cmd, what):
    """Runs cmd quietly; RuntimeError with its output when it fails."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s exited with status %d: %s\n%s"
                           % (what, p.returncode, " ".join(cmd), p.stdout[-4000:]))


def file_types(path):
    """{tensor name: (type, row width)} of a GGUF file."""
    reader = gguf.GGUFReader(path)
    return {t.name: (Q(t.tensor_type), int(t.shape[0])) for t in reader.tensors}


def check_types(mix, types, n_gqa, tied):
    """The problems with a file's tensor types against expected_type."""
    problems = []
    for name, (t, row) in sorted(types.items()):
        want = expected_type(mix, name, row, n_gqa, tied)
        if want is not None and t != want:
            problems.append("%s is %s; llama-quant.cpp's rules give %s" % (name, t.name, want.name))
    return problems


def te_logits(binary, folder, path, ids_file):
    """{layout: (logits, held_blocks or None)} te writes for the GGUF file at path."""
    out = "%s.%s.te.json" % (path, os.path.splitext(os.path.basename(ids_file))[0])
    run([binary, "--model", path, "--ids", ids_file, "--out", out, "--logits-only"], binary)
    layouts = {}
    for name, t in json.load(open(out))["layouts"].items():
        logits = torch.from_numpy(np.fromfile(t["logits_file"], dtype=np.float32))
        layouts[name] = (logits.double().reshape(t["shape"]), t.get("held_blocks"))
    return layouts


def check_family(binary, workdir, index, case, config_class, model_class, kwargs, convert,
                 quantize, tokenizer):
    """[(mix, type counts, held_blocks, {rows: {layout: error}}, [problems])] for one
    family."""
    seed = 2000 + index
    model = build(config_class, model_class, {}, seed, {**SIZES, **kwargs})
    c = model.config
    folder = os.path.join(workdir, case)
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder, safe_serialization=True)
    with open(os.path.join(folder, "tokenizer.model"), "wb") as f:
        f.write(tokenizer)
    batches = []  # (ids, ids file)
    for n in ROWS:
        ids = token_ids(seed)[:, :n]
        batches.append((ids, os.path.join(folder, "ids-%d.json" % n)))
        with open(batches[-1][1], "w") as f:
            json.dump({"ids": ids.tolist()}, f)
    f16 = os.path.join(folder, "F16.gguf")
    run([sys.executable, convert, folder, "--outfile", f16, "--outtype", "f16"],
        "convert_hf_to_gguf.py")
    results = []
    for mix in MIXES:
        name = mix + ".gguf"
        path = os.path.join(folder, name)
        run([quantize, f16, path, mix, str(os.cpu_count() or 1)], "llama-quantize")
        types = file_types(path)
        problems = check_types(mix, types, c.num_attention_heads // c.num_key_value_heads,
                               c.tie_word_embeddings)
        counts = collections.Counter(t.name for t, _ in types.values())
        want = from_gguf(folder, name).eval()
        errors, held = {}, None  # errors: {rows: {layout: error}}
        for ids, ids_file in batches:
            with torch.no_grad():
                logits = want(input_ids=ids).logits.double()
            rows = "%d rows" % ids.numel()
            layouts = te_logits(binary, folder, path, ids_file)
            if "one-blocks" not in layouts:
                problems.append("%s: te wrote no one-blocks layout" % rows)
            errors[rows] = {}
            for layout in sorted(layouts, key=lambda l: (LAYOUT_ORDER.get(l, 9), l)):
                mine, held_here = layouts[layout]
                if mine.shape != logits.shape:
                    problems.append("%s, %s: logits of shape %s, not %s"
                                    % (layout, rows, list(mine.shape), list(logits.shape)))
                    errors[rows][layout] = float("inf")
                    continue
                errors[rows][layout] = rel_err(mine, logits)
                if layout == "one-blocks":
                    held = held_here
                    if not held_here:
                        problems.append("one-blocks, %s: no weight held in GGUF blocks" % rows)
        results.append((mix, counts, held, errors, problems))
    return results


def main(binary, workdir):
    transformers.utils.logging.disable_progress_bar()
    os.makedirs(workdir, exist_ok=True)
    convert, quantize = llama_cpp()
    tokenizer = spm_tokenizer()
    failures = total = 0
    for index, (case, *family) in enumerate(FAMILIES):
        try:
            results = check_family(binary, workdir, index, case, *family, convert, quantize,
                                   tokenizer)
        except RuntimeError as e:
            failures, total = failures + 1, total + 1
            print_failure(case, e)
            continue
        for mix, counts, held, errors, problems in results:
            bad = problems or [k for e in errors.values() for k, v in e.items()
                               if not v <= GGUF_TOL]
            failures, total = failures + bool(bad), total + 1
            print("%s %s/%s: types %s; one-blocks holds %s parameters in blocks" % (
                "FAIL" if bad else "ok  ", case, mix,
                " ".join("%s:%d" % kv for kv in sorted(counts.items())), held))
            for rows, e in errors.items():
                print("     %s: %s" % (rows, ", ".join("%s %.2g" % kv for kv in e.items())))
            for p in problems:
                print("     %s" % p)
    print("%d of %d family mixes differ from transformers %s (tolerance %g)"
          % (failures, total, transformers.__version__, GGUF_TOL))
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
