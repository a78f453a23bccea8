"""Holds te-generate's greedy decoding to transformers' generate() on random models of every
family te-cpp loads: each family's random model (check_hf_models.py's configs and build(), with
room for 64 new tokens) saved by save_pretrained with a character-level tokenizer.json, a prompt
of 8 tokens, 64 new tokens greedily past any end-of-sequence token, on one process and on
--nproc 2 (tensor parallel: the KV cache sharded with the heads; the mixtures of experts also
expert parallel, EXPERT_PARALLEL). Every token id must be
transformers' (GenerationMixin.generate, do_sample=False, its DynamicCache).

Random models have flat logits: each case prints the smallest relative gap between
transformers' two best logits over its steps, and a first difference is reported with the gap
at that step (a tie below 1e-4 is named as one, and still fails).

  python check_generate_families.py TE_GENERATE WORKDIR

CHECK_CASES=a,b runs those cases only.
"""

import json
import os
import subprocess
import sys

os.environ.setdefault("TQDM_DISABLE", "1")

import torch
import transformers
from check_hf_models import FAMILIES, GPT2, GPT2_SIZES, SIZES, VOCAB, build
from interop_common import print_failure
from transformers import GPT2Config, GPT2LMHeadModel

NEW_TOKENS = 64
PROMPT_IDS = [5, 17, 3, 99, 42, 64, 8, 120]
POSITIONS = 128  # the prompt and the new tokens fit
TIE = 1e-4

# One case of each family and of each RoPE kind a KV-cached step runs through (LongRoPE within
# its original length: te's cache refuses to cross it, see docs/guide.md).
CASES = ["llama", "llama-llama3-rope", "mistral", "qwen2-sliding", "qwen3", "llama-yarn-rope",
         "phi3", "phi3-longrope-short-partial", "gemma", "gemma2", "gemma3",
         "gemma3-pattern-untied-bias", "gpt2", "qwen3-moe", "qwen2-moe-shared-dense-layer",
         "mixtral", "olmoe", "gpt-oss"]
MIXTURES = {"qwen3-moe", "qwen2-moe-shared-dense-layer", "mixtral", "olmoe", "gpt-oss"}
# The mixtures of experts also run expert parallel: experts split over the two ranks' axis
# (which the attention's heads split too), each rank's experts on every token, partial sums.
EXPERT_PARALLEL = ["--mesh-resource", "tp=model,ep=model"]


def char(i):
    """Token i's text: one letter of Latin Extended-A (U+0100...), so a prompt is ids in order."""
    return chr(0x100 + i)


def write_tokenizer(folder):
    """A character-level BPE tokenizer.json (no merges): token i is char(i)."""
    from tokenizers import Tokenizer, models
    tokenizer = Tokenizer(models.BPE(vocab={char(i): i for i in range(VOCAB)}, merges=[]))
    tokenizer.save(os.path.join(folder, "tokenizer.json"))


def model_for(case, seed):
    """The case's random model with POSITIONS positions (LongRoPE's original length too: te's KV
    cache generates within it, so that case rotates by its short factors, with the attention
    factor of max_position_embeddings twice that)."""
    if case == "gpt2":
        kwargs = dict(GPT2)[case]
        return build(GPT2Config, GPT2LMHeadModel, kwargs, seed,
                     dict(GPT2_SIZES, n_positions=POSITIONS))
    config_class, model_class, kwargs = {c: (cc, mc, kw) for c, cc, mc, kw in FAMILIES}[case]
    positions = POSITIONS
    if "original_max_position_embeddings" in kwargs:
        kwargs = dict(kwargs, original_max_position_embeddings=POSITIONS)
        positions = 2 * POSITIONS
    return build(config_class, model_class, kwargs, seed,
                 dict(SIZES, max_position_embeddings=positions))


def transformers_greedy(model):
    """generate()'s ids after the prompt, and each step's gap between its two best logits."""
    ids = torch.tensor([PROMPT_IDS])
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             output_logits=True, return_dict_in_generate=True)
    gaps = []
    for logits in out.logits:
        top = logits[0].float().topk(2).values
        gaps.append(float(top[0] - top[1]) / max(float(top[0].abs()), 1e-30))
    return out.sequences[0, len(PROMPT_IDS):].tolist(), gaps


def te_greedy(binary, folder, nproc, extra=()):
    prompt = "".join(char(i) for i in PROMPT_IDS)
    cmd = [binary, "--model", folder, "--prompt", prompt, "--max-tokens", str(NEW_TOKENS),
           "--temperature", "0", "--ignore-eos", "--json", "--nproc", str(nproc), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("te-generate failed (%d): %s" % (r.returncode, r.stderr.strip()))
    out = json.loads(r.stdout)
    if out["prompt_ids"] != PROMPT_IDS:
        raise RuntimeError("te tokenized the prompt as %s, not %s" % (out["prompt_ids"],
                                                                       PROMPT_IDS))
    return out["tokens"]


def main(binary, workdir):
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()  # the random configs' token-id warnings
    failures = 0
    only = [c for c in os.environ.get("CHECK_CASES", "").split(",") if c]  # a developer's subset
    if only and not set(only) & set(CASES):
        print("CHECK_CASES=%s names no case" % ",".join(only))
        return 1
    for index, case in enumerate(CASES):
        if only and case not in only:
            continue
        try:
            model = model_for(case, 2000 + index)
            folder = os.path.join(workdir, case)
            model.save_pretrained(folder)
            write_tokenizer(folder)
            want, gaps = transformers_greedy(model)
            runs = [(1, ()), (2, ())] + ([(2, EXPERT_PARALLEL)] if case in MIXTURES else [])
            for nproc, extra in runs:
                got = te_greedy(binary, folder, nproc, extra)
                label = " ".join(["--nproc %d" % nproc, *extra])
                first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
                if first is None and len(got) == len(want):
                    print("ok   %s %s: %d tokens, every one transformers' (smallest "
                          "top-2 gap %.1e)" % (case, label, len(got), min(gaps)))
                    continue
                failures += 1
                where = "length %d vs %d" % (len(got), len(want)) if first is None else \
                    "token %d: te %d, transformers %d (top-2 gap there %.1e%s)" % (
                        first, got[first], want[first], gaps[first],
                        ", a tie" if gaps[first] < TIE else "")
                print("FAIL %s %s: first difference at %s" % (case, label, where))
        except RuntimeError as e:
            failures += 1
            print_failure(case, e)
    print("%d case runs differ from transformers' greedy generate()" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    os.makedirs(sys.argv[2], exist_ok=True)
    sys.exit(main(sys.argv[1], sys.argv[2]))
