"""te-train --export-gguf held to gguf-py and llama.cpp: random models of each family te exports
(CASES) written as llama.cpp's converter writes them (gguf_files.py, Q8_0): Llama ("llama"; one
with Llama 3's RoPE factors in rope_freqs.weight, one with a tied head), Qwen2 ("qwen2": q/k/v
biases, rows as in transformers), Gemma 2 and Gemma 3 ("gemma2", "gemma3": every norm weight
stored plus one, Gemma 3's q/k norms among them; a tied head and no output.weight), Qwen3-MoE
("qwen3moe": the experts stacked, the router F32), Mixtral ("llama" with experts), OLMoE
("olmoe": q/k norms over each token's whole query and key) and gpt-oss ("gpt-oss": its experts
MXFP4 in the source, their biases, sinks, YaRN), their norm
scales and biases moved off their initial values, fine-tuned by te-train on a text of their
vocabulary's pieces and exported:

- at a learning rate of 1e-12 the f32 export is the source file's weights as gguf-py dequantizes
  them (within 1e-6: the names, shapes, Llama's query/key row interleave, the norms plus one, the
  biases and the tensors that are not weights, RoPE factors, all written back as llama.cpp reads
  them), with every metadata key of the source kept (general.file_type set to ALL_F32);
- at a learning rate of 3e-3 the f32 export differs from the source (the trained weights are
  written), and the f16, bf16 and q8_0 exports of the same run are its f32 weights converted
  exactly as gguf-py converts them (numpy's float16, ggml's bfloat16 rounding, and
  gguf.quants.quantize for Q8_0, which is ggml's reference quantizer bit for bit);
- llama.cpp's llama-perplexity (scripts/llama-cpp.sh; skipped with a note where it cannot be
  built) loads each export and computes a finite perplexity over the text's first 4 chunks (a run
  that stops early is run again), lower for the trained f32 export than for the source file.

  python check_train_gguf.py TE_TRAIN WORKDIR

CHECK_CASES=a,b runs those cases only.
"""

import math
import os
import random
import re
import shutil
import subprocess
import sys

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
import gguf_files
from gguf_files import write_gemma_gguf, write_gguf
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig,
                          GptOssConfig, GptOssForCausalLM, LlamaConfig, LlamaForCausalLM,
                          MixtralConfig, MixtralForCausalLM, OlmoeConfig, OlmoeForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = dict(vocab_size=384, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
             rms_norm_eps=1e-6, rope_parameters=dict(rope_type="default", rope_theta=10000.0))
LLAMA = (LlamaConfig, LlamaForCausalLM, "llama")
# Gemma's head_dim (256 by default) given; the config class's defaults otherwise (Gemma 2's soft
# caps, Gemma 3's RoPE bases), which are what te and transformers read from a GGUF file.
GEMMA = dict(head_dim=16, sliding_window=4)
# (case, (config class, model class, llama.cpp architecture), config arguments over SIZES).
CASES = [
    ("llama", LLAMA, dict(tie_word_embeddings=False)),
    ("llama-tied", LLAMA, dict(tie_word_embeddings=True)),
    ("llama3-rope", LLAMA, dict(tie_word_embeddings=False,
                                rope_parameters=dict(rope_type="llama3", rope_theta=10000.0,
                                                     factor=8.0, low_freq_factor=1.0,
                                                     high_freq_factor=4.0,
                                                     original_max_position_embeddings=64))),
    # q/k/v biases, rows as in transformers (no permutation).
    ("qwen2", (Qwen2Config, Qwen2ForCausalLM, "qwen2"), dict(tie_word_embeddings=False)),
    # Norms stored plus one (Gemma 2's four per layer), a tied head and no output.weight, soft caps.
    ("gemma2", (Gemma2Config, Gemma2ForCausalLM, "gemma2"), GEMMA),
    # Gemma 3's q/k norms plus one as well; its own RoPE bases (1e6 global, 1e4 sliding).
    ("gemma3", (Gemma3TextConfig, Gemma3ForCausalLM, "gemma3"),
     dict(GEMMA, rope_parameters=None)),
    # A mixture of experts: the experts stacked as ffn_{gate,up,down}_exps [experts, out, in], the
    # router ffn_gate_inp kept F32 in every export, q/k norms.
    ("qwen3-moe", (Qwen3MoeConfig, Qwen3MoeForCausalLM, "qwen3moe"),
     dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True,
          tie_word_embeddings=False)),
    # Mixtral, which llama.cpp writes as "llama" with llama.expert_count (q/k rows permuted).
    ("mixtral", (MixtralConfig, MixtralForCausalLM, "llama"),
     dict(num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)),
    # OLMoE: llama.cpp sizes attn_k_norm by embedding_length (every head a key/value head) and
    # never renormalises the top 2; OlmoeModel's norm epsilon 1e-5.
    ("olmoe", (OlmoeConfig, OlmoeForCausalLM, "olmoe"),
     dict(num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, num_key_value_heads=4,
          rms_norm_eps=1e-5, tie_word_embeddings=False)),
    # gpt-oss with its experts in MXFP4 (as GptOssModel repacks OpenAI's); exported as the rest.
    ("gpt-oss", (GptOssConfig, GptOssForCausalLM, "gpt-oss"),
     dict(num_local_experts=4, num_experts_per_tok=2, head_dim=16, sliding_window=4,
          tie_word_embeddings=False, experts_qtype=Q.MXFP4,
          rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0,
                               beta_fast=32.0, beta_slow=1.0, truncate=True,
                               original_max_position_embeddings=4096))),
]


def write_tokenizer(w, c):
    """A SentencePiece vocabulary both te and llama.cpp tokenize the text with (gguf_files' minimal
    one has no byte or single-character pieces, which llama.cpp's tokenizer needs): <unk>, <s>,
    </s>, the 256 byte tokens, "\u2581", "t", the digits, "\u2581t", then "\u2581t3" ... pieces,
    scored so that longer pieces merge first."""
    pieces = ["\u2581", "t"] + [str(d) for d in range(10)] + ["\u2581t"]
    pieces += ["\u2581t%d" % i for i in range(3, 3 + c.vocab_size - 3 - 256 - len(pieces))]
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + pieces
    assert len(tokens) == c.vocab_size
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + [float(len(p)) for p in pieces])
    w.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
                      + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(pieces))
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


gguf_files.write_tokenizer = write_tokenizer


def tensors(path):
    """{name: (ggml type, float32 values in row-major shape, raw bytes)} of a GGUF file."""
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        shape = list(reversed([int(n) for n in t.shape]))
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        out[t.name] = (t.tensor_type, values, bytes(t.data.tobytes()))
    return out


def metadata(path):
    r = gguf.GGUFReader(path)
    return {k: (f.types, [bytes(p.tobytes()) for p in f.parts[f.data[0]:]] if f.data else [])
            for k, f in r.fields.items() if not k.startswith("GGUF.")}


def bf16_bytes(values):
    """ggml's fp32 -> bf16 (round to nearest even; gguf-py quants.py __compute_fp32_to_bf16)."""
    n = values.astype(np.float32).view(np.uint32)
    n = np.where((n & 0x7fffffff) > 0x7f800000, (n & 0xffff0000) | (64 << 16), n)
    n = (n.astype(np.uint64) + (0x7fff + ((n >> 16) & 1))) >> 16
    return n.astype(np.uint16).tobytes()


def run(te_train, case_dir, lr, kind, out):
    subprocess.run([te_train, "--model", os.path.join(case_dir, "source.gguf"), "--data",
                    os.path.join(case_dir, "text.txt"), "--steps", "12", "--seq-len", "16",
                    "--micro-batch", "2", "--lr", str(lr), "--quiet", "--export-gguf", out,
                    "--export-gguf-type", kind], check=True)
    return out


CHUNKS = 4  # llama-perplexity's 16-token chunks of the text


def llama_perplexity(path, text):
    """llama.cpp's perplexity over `text`, or None where llama-perplexity cannot be built."""
    built = subprocess.run(["bash", os.path.join(HERE, "../../scripts/llama-cpp.sh"),
                            "llama-perplexity"], capture_output=True, text=True)
    if built.returncode != 0:
        print("     note: llama-perplexity not built (%s); llama.cpp's loader not run" %
              built.stderr.strip().splitlines()[-1:])
        return None
    # The running estimate after each chunk, "[4]386.9575," on stdout. One thread: with two, half
    # the runs here stop after the thread pool starts (exit 0, nothing computed), gguf-py's own
    # files too. --no-repack: the repacked Q8_0 kernels (AMX here) crash on those as well. Even
    # so a run often stops early (exit 0 after chunk 3, say; measured 2026-12-06: 2 runs in 5 on
    # an idle machine, on every file, gguf-py's own among them, and 5 in a row on a loaded one;
    # never under strace, so a race of llama.cpp's own): run it again until all CHUNKS are in,
    # so that every perplexity compared is over the same text.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for _ in range(30):
        p = subprocess.run([built.stdout.strip().splitlines()[-1], "-m", path, "-f", text, "-c",
                            "16", "-b", "16", "--chunks", str(CHUNKS), "-t", "1", "--no-repack"],
                           capture_output=True, text=True, env=env)
        chunks = re.findall(r"\[(\d+)\]([0-9.eE+-]+|nan|inf)", p.stdout)
        if p.returncode != 0 or len(chunks) == CHUNKS:
            break
    if p.returncode != 0 or len(chunks) != CHUNKS:
        raise AssertionError("llama-perplexity failed on %s (%d): %s" %
                             (path, p.returncode, (p.stdout + p.stderr)[-600:]))
    return float(chunks[-1][1])


def source_model(classes, extra):
    """The random model; beyond Llama, every norm scale and bias moved off its initial value (0 or
    1), so that a norm's plus one and each bias are held to the source's own values."""
    config_class, model_class, arch = classes
    torch.manual_seed(0)
    kwargs = {k: v for k, v in {**SIZES, **extra}.items()
              if v is not None and k != "experts_qtype"}
    model = model_class(config_class(**kwargs)).to(torch.float32).eval()
    if arch != "llama":
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name and name.endswith(".weight"):
                    p.add_(0.2 * torch.randn_like(p))
                elif name.endswith(".bias"):
                    p.add_(0.1 * torch.randn_like(p))
    return model


def check(te_train, workdir, name, classes, extra):
    case_dir = os.path.join(workdir, name)
    shutil.rmtree(case_dir, ignore_errors=True)  # a token file of an earlier run's vocabulary
    os.makedirs(case_dir)
    model, arch = source_model(classes, extra), classes[2]
    if arch.startswith("gemma"):
        write_gemma_gguf(model, os.path.join(case_dir, "source.gguf"), Q.Q8_0, arch)
    else:
        write_gguf(model, os.path.join(case_dir, "source.gguf"), Q.Q8_0, Q.Q8_0,
                   extra.get("experts_qtype"))
    rng = random.Random(1)
    with open(os.path.join(case_dir, "text.txt"), "w") as f:
        for _ in range(80):
            f.write(" ".join("t%d" % rng.randrange(3, 100) for _ in range(rng.randrange(5, 20))))
            f.write("\n\n")
    errors = {}
    source = tensors(os.path.join(case_dir, "source.gguf"))
    same = tensors(run(te_train, case_dir, 1e-12, "f32", os.path.join(case_dir, "same.gguf")))
    errors["names"] = float(set(same) != set(source))
    errors["lr 1e-12 f32 export vs source"] = max(
        float(np.abs(same[n][1] - v).max()) for n, (_, v, _) in source.items()) / 1e-6
    src_meta = metadata(os.path.join(case_dir, "source.gguf"))
    out_meta = metadata(os.path.join(case_dir, "same.gguf"))
    errors["metadata kept"] = float(any(out_meta.get(k) != v for k, v in src_meta.items()
                                        if k != "general.file_type"))
    trained = {k: run(te_train, case_dir, 3e-3, k, os.path.join(case_dir, "trained-%s.gguf" % k))
               for k in ("f32", "f16", "bf16", "q8_0")}
    f32 = tensors(trained["f32"])
    moved = max(float(np.abs(f32[n][1] - v).max()) for n, (_, v, _) in source.items())
    errors["trained weights written (1e-4 / moved)"] = 1e-4 / max(moved, 1e-30)
    want = {"f16": lambda v: v.astype(np.float16).tobytes(), "bf16": bf16_bytes,
            "q8_0": lambda v: gguf.quants.quantize(v, Q.Q8_0).tobytes()}
    for kind, encode in want.items():
        got = tensors(trained[kind])

        def expected(n, v):  # 1-dim tensors, biases and routers stay f32; q8_0 rows not whole
            # blocks f16
            if v.ndim < 2 or n.endswith("ffn_gate_inp.weight") or not n.endswith(".weight"):
                return v.tobytes()
            if kind == "q8_0" and v.shape[-1] % 32:
                return v.astype(np.float16).tobytes()
            return encode(v)
        bad = [n for n, (_, v, _) in f32.items() if got[n][2] != expected(n, v)]
        errors["%s bytes differ (tensors)" % kind] = float(len(bad))
    text = os.path.join(case_dir, "text.txt")
    ppl = {k: llama_perplexity(p, text) for k, p in trained.items()}
    ppl["source"] = llama_perplexity(os.path.join(case_dir, "source.gguf"), text)
    errors["llama.cpp perplexity not finite"] = float(
        any(v is not None and not math.isfinite(v) for v in ppl.values()))
    if ppl["source"] is not None:  # trained on the text: llama.cpp finds it likelier
        errors["llama.cpp perplexity f32 / source"] = ppl["f32"] / ppl["source"]
    bad = {k: e for k, e in errors.items() if not e <= 1.0}
    print("%s %s: %s" % ("FAIL" if bad else "ok  ", name,
                         ", ".join("%s %.3g" % kv for kv in errors.items())))
    print("     llama.cpp perplexity: %s" % ", ".join(
        "%s %s" % (k, "not run" if v is None else "%.2f" % v) for k, v in ppl.items()))
    return not bad


def main():
    te_train, workdir = sys.argv[1], sys.argv[2]
    os.makedirs(workdir, exist_ok=True)
    torch.set_num_threads(1)
    only = [c for c in os.environ.get("CHECK_CASES", "").split(",") if c]  # a developer's subset
    cases = [case for case in CASES if not only or case[0] in only]
    if not cases:
        print("CHECK_CASES=%s names no case" % ",".join(only))
        return 1
    failures = sum(not check(te_train, workdir, *case) for case in cases)
    print("%d of %d exports differ from gguf-py's encoding or fail llama.cpp's loader" %
          (failures, len(cases)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
