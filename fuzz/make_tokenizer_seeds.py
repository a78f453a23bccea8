"""Writes the tokenizer seeds of fuzz_gguf (fuzz/corpus/gguf/tokenizer-*.gguf): vocabulary-only
GGUF files as llama.cpp's converters write them (gguf-py's GGUFWriter), one per kind te-cpp
builds from GGUF metadata: byte-level BPE with a pre-tokenizer name ("gpt2", "qwen2"),
SentencePiece BPE ("llama": pieces, scores, byte tokens), Gemma 4's BPE ("gemma4": merges over
U+2581-spaced text, byte tokens) and WordPiece ("bert").

  build/venv-cuda/bin/python fuzz/make_tokenizer_seeds.py
"""

import os

import gguf

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "gguf")
T = gguf.TokenType


def byte_level_chars():
    """GPT-2's printable stand-ins for the 256 bytes (the byte-level alphabet)."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return [out[b] for b in range(256)]


def write(name, model, tokens, types, extra):
    w = gguf.GGUFWriter(os.path.join(OUT, name), "llama")
    w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    w.add_token_types(types)
    extra(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    chars = byte_level_chars()
    merges = ["\u0120 t", "h e", "\u0120t he", "l l", "1 2"]
    bpe = ["<|endoftext|>"] + chars + ["\u0120t", "he", "\u0120the", "ll", "12"]
    write("tokenizer-qwen2.gguf", "gpt2", bpe, [T.CONTROL] + [T.NORMAL] * (len(bpe) - 1),
          lambda w: (w.add_tokenizer_pre("qwen2"), w.add_token_merges(merges),
                     w.add_eos_token_id(0)))
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + \
        ["\u2581", "\u2581t", "he", "\u2581the", "ll", "o", "\u2581w"]
    spm_types = [T.UNKNOWN, T.CONTROL, T.CONTROL] + [T.BYTE] * 256 + [T.NORMAL] * 7
    scores = [0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0]
    write("tokenizer-llama.gguf", "llama", pieces, spm_types,
          lambda w: (w.add_token_scores(scores), w.add_bos_token_id(1), w.add_eos_token_id(2),
                     w.add_unk_token_id(0), w.add_add_bos_token(True)))
    g4 = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>"] + \
        [f"<0x{b:02X}>" for b in range(256)] + ["\u2581", "t", "h", "e", "\u2581t", "he",
                                                 "\u2581the", "\n", "\n\n"]
    g4_types = [T.CONTROL] * 4 + [T.USER_DEFINED] + [T.BYTE] * 256 + [T.NORMAL] * 9
    write("tokenizer-gemma4.gguf", "gemma4", g4, g4_types,
          lambda w: (w.add_token_merges(["\u2581 t", "h e", "\u2581t he", "\n \n"]),
                     w.add_bos_token_id(2), w.add_eos_token_id(1), w.add_unk_token_id(3),
                     w.add_pad_token_id(0), w.add_add_bos_token(True)))
    wp = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "\u2581hello", "\u2581world", "o", "\u2581caf", "\u00e9"]
    write("tokenizer-bert.gguf", "bert", wp,
          [T.CONTROL] * 4 + [T.NORMAL] * 5,
          lambda w: (w.add_unk_token_id(1), w.add_uint32("tokenizer.ggml.cls_token_id", 2),
                     w.add_uint32("tokenizer.ggml.seperator_token_id", 3),
                     w.add_pad_token_id(0)))


if __name__ == "__main__":
    main()
