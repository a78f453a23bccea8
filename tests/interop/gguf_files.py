"""GGUF files as llama.cpp's convert_hf_to_gguf.py writes them (llama-cpp-python 0.3.36's vendored
llama.cpp: conversion/llama.py LlamaModel, conversion/phi.py Phi3MiniModel, conversion/qwen.py
Qwen2Model, conversion/gemma.py Gemma2Model and Gemma3Model), written with gguf-py
from a transformers model, for check_hf_models.py's and check_train_gguf.py's GGUF cases:

- Llama ("llama"): attn_q and attn_k rows permuted (LlamaModel.permute), Llama 3's RoPE scaling as
  rope_freqs.weight (generate_extra_tensors);
- Phi-3 ("phi3"): qkv_proj and gate_up_proj whole as attn_qkv and ffn_up, context_length,
  rope.scaling.original_context_length, rope.dimension_count int(partial * hidden) // heads,
  attention.sliding_window (0 for none), and LongRoPE's factors as rope_factors_long.weight /
  rope_factors_short.weight with rope.scaling.attn_factor sqrt(1 + ln(scale) / ln(original)),
  scale = max_position_embeddings / original;
- Qwen2 ("qwen2"): rows as in transformers (no permutation), the q/k/v biases as attn_q.bias,
  attn_k.bias and attn_v.bias (F32), TextModel.set_gguf_parameters' keys (context_length,
  rope.freq_base; no vocab_size, no rope.dimension_count);
- Qwen3-MoE and Qwen2-MoE ("qwen3moe", "qwen2moe"): Qwen2's keys plus expert_count,
  expert_used_count, expert_feed_forward_length (and expert_shared_feed_forward_length), the
  router as ffn_gate_inp, the experts stacked as ffn_{gate,up,down}_exps [E, out, in], Qwen2-MoE's
  shared expert as ffn_*_shexp with its gate ffn_gate_inp_shexp written [H];
- Mixtral ("llama" with llama.expert_count): Llama's, its experts stacked as Qwen's;
- OLMoE ("olmoe", conversion/olmo.py OlmoeModel): Qwen2's keys, the expert counts (experts of
  feed_forward_length), the q/k norms of each token's whole query and key, the experts as Qwen's
  (OlmoeModel also writes attention.layer_norm_rms_epsilon 1e-5 whatever the config says: the
  cases give 1e-5, and this writes the config's);
- gpt-oss ("gpt-oss", conversion/gpt_oss.py GptOssModel): rows as transformers' (no
  permutation), TextModel's keys (key/value lengths, the expert counts, YaRN's
  rope.scaling.{type,factor,original_context_length,yarn_beta_fast,yarn_beta_slow}), the window,
  expert_feed_forward_length; post_attention_layernorm as post_attention_norm, the sinks as
  attn_sinks.weight, the router with its bias as ffn_gate_inp, the fused experts transposed and
  split (gate_up_proj's even columns the gate, odd ones up) into ffn_{gate,up,down}_exps with
  their biases ([E, F], F32 as every tensor not ending in .weight); OpenAI's MXFP4 experts are
  repacked as ggml's MXFP4, which `experts_qtype` MXFP4 stands for here (the floats quantized by
  gguf-py's MXFP4 quantizer);
- Gemma 2 and 3 ("gemma2", "gemma3"): every norm weight stored plus one, no output.weight (tied),
  Gemma 2's soft caps, Gemma 3's global and sliding RoPE bases (rope.freq_base,
  rope.freq_base_swa), the sliding window.

Each with a minimal SentencePiece ("llama") vocabulary, the 2-dim weights quantized (F16 where
the blocks do not tile a row, as the converter falls back on gguf.QuantError) and the norms F32.
"""

import math
import re

import gguf
import torch
from gguf import GGMLQuantizationType as Q

GGUF_FILE_TYPES = {Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0, Q.Q4_1: gguf.LlamaFileType.MOSTLY_Q4_1}

# Hugging Face name (with N for the layer) -> GGUF name, as convert_hf_to_gguf.py maps a Llama;
# a Phi-3's fused tensors after it.
GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.N.input_layernorm.weight": "blk.N.attn_norm.weight",
    "model.layers.N.self_attn.q_proj.weight": "blk.N.attn_q.weight",
    "model.layers.N.self_attn.k_proj.weight": "blk.N.attn_k.weight",
    "model.layers.N.self_attn.v_proj.weight": "blk.N.attn_v.weight",
    "model.layers.N.self_attn.o_proj.weight": "blk.N.attn_output.weight",
    "model.layers.N.post_attention_layernorm.weight": "blk.N.ffn_norm.weight",
    "model.layers.N.mlp.gate_proj.weight": "blk.N.ffn_gate.weight",
    "model.layers.N.mlp.up_proj.weight": "blk.N.ffn_up.weight",
    "model.layers.N.mlp.down_proj.weight": "blk.N.ffn_down.weight",
}
QWEN2_NAMES = {
    "model.layers.N.self_attn.q_proj.bias": "blk.N.attn_q.bias",
    "model.layers.N.self_attn.k_proj.bias": "blk.N.attn_k.bias",
    "model.layers.N.self_attn.v_proj.bias": "blk.N.attn_v.bias",
}
# Qwen3's q/k norms and the Qwen MoE layouts' router and shared expert (conversion/qwen.py
# Qwen2MoeModel, which Qwen3MoeModel inherits); the experts are written by write_experts.
QWEN_MOE_NAMES = {
    "model.layers.N.self_attn.q_norm.weight": "blk.N.attn_q_norm.weight",
    "model.layers.N.self_attn.k_norm.weight": "blk.N.attn_k_norm.weight",
    "model.layers.N.mlp.gate.weight": "blk.N.ffn_gate_inp.weight",
    "model.layers.N.mlp.shared_expert.gate_proj.weight": "blk.N.ffn_gate_shexp.weight",
    "model.layers.N.mlp.shared_expert.up_proj.weight": "blk.N.ffn_up_shexp.weight",
    "model.layers.N.mlp.shared_expert.down_proj.weight": "blk.N.ffn_down_shexp.weight",
    "model.layers.N.mlp.shared_expert_gate.weight": "blk.N.ffn_gate_inp_shexp.weight",
}
PHI3_NAMES = {
    "model.layers.N.self_attn.qkv_proj.weight": "blk.N.attn_qkv.weight",
    "model.layers.N.mlp.gate_up_proj.weight": "blk.N.ffn_up.weight",
}


def permute(w, n_head):
    """llama.cpp's LlamaModel.permute of attn_q / attn_k rows (each head's rotary halves
    interleaved), which transformers' LlamaTensorProcessor undoes."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def llama3_rope_freqs(c):
    """What llama.cpp's convert_hf_to_gguf.py (LlamaModel.generate_extra_tensors) writes as
    rope_freqs.weight for a llama3 rope_parameters: per rotary pair the factor its inverse
    frequency is divided by."""
    r = c.rope_parameters
    base, dim, factor = r["rope_theta"], c.head_dim, r["factor"]
    low, high, old = r["low_freq_factor"], r["high_freq_factor"], \
        r["original_max_position_embeddings"]
    factors = []
    for freq in 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)):
        wavelen = 2 * math.pi / float(freq)
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(factors, dtype=torch.float32).numpy()


def write_llama_keys(w, c):
    """LlamaModel's set_gguf_parameters and extra tensors."""
    w.add_context_length(c.max_position_embeddings)
    # LlamaModel's hparams["head_dim"], else hidden_size / heads (MixtralConfig keeps None).
    w.add_rope_dimension_count(c.head_dim or c.hidden_size // c.num_attention_heads)
    if c.rope_parameters.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_freqs(c))
    w.add_vocab_size(c.vocab_size)


def write_phi3_keys(w, c):
    """Phi3MiniModel's set_gguf_parameters and generate_extra_tensors."""
    r = c.rope_parameters
    original = r.get("original_max_position_embeddings", c.original_max_position_embeddings)
    w.add_context_length(c.max_position_embeddings)
    w.add_rope_scaling_orig_ctx_len(original)
    w.add_rope_dimension_count(int(r.get("partial_rotary_factor", 1.0) * c.hidden_size)
                               // c.num_attention_heads)
    w.add_sliding_window(c.sliding_window or 0)
    if r.get("long_factor"):
        scale = c.max_position_embeddings / original
        w.add_rope_scaling_attn_factors(
            math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0)
        w.add_tensor("rope_factors_long.weight", torch.tensor(r["long_factor"],
                                                              dtype=torch.float32).numpy())
        w.add_tensor("rope_factors_short.weight", torch.tensor(r["short_factor"],
                                                               dtype=torch.float32).numpy())


def write_qwen2_keys(w, c):
    """Qwen2Model's set_gguf_parameters (TextModel's: no pooling without modules.json, no rope
    scaling keys for the default RoPE, key/value lengths only where config.json has head_dim)."""
    w.add_context_length(c.max_position_embeddings)
    if c.to_dict().get("head_dim") is not None:
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)


def write_qwen_moe_keys(w, c):
    """Qwen2MoeModel's set_gguf_parameters: Qwen2's keys, the expert counts and sizes (and the
    shared expert's for Qwen2-MoE)."""
    write_qwen2_keys(w, c)
    w.add_expert_count(c.num_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_expert_feed_forward_length(c.moe_intermediate_size)
    if getattr(c, "shared_expert_intermediate_size", 0):
        w.add_expert_shared_feed_forward_length(c.shared_expert_intermediate_size)


def write_mixtral_keys(w, c):
    """LlamaModel's keys for a Mixtral (conversion/llama.py registers MixtralForCausalLM under
    "llama"): Llama's, and the expert counts (the experts are of feed_forward_length)."""
    write_llama_keys(w, c)
    w.add_expert_count(c.num_local_experts)
    w.add_expert_used_count(c.num_experts_per_tok)


def write_olmoe_keys(w, c):
    """OlmoeModel's keys: TextModel's (Qwen2's here) and the expert counts; its experts are of
    feed_forward_length."""
    write_qwen2_keys(w, c)
    w.add_expert_count(c.num_experts)
    w.add_expert_used_count(c.num_experts_per_tok)


GPT_OSS_NAMES = {
    "model.layers.N.self_attn.q_proj.bias": "blk.N.attn_q.bias",
    "model.layers.N.self_attn.k_proj.bias": "blk.N.attn_k.bias",
    "model.layers.N.self_attn.v_proj.bias": "blk.N.attn_v.bias",
    "model.layers.N.self_attn.o_proj.bias": "blk.N.attn_output.bias",
    "model.layers.N.self_attn.sinks": "blk.N.attn_sinks.weight",
    "model.layers.N.post_attention_layernorm.weight": "blk.N.post_attention_norm.weight",
    "model.layers.N.mlp.router.weight": "blk.N.ffn_gate_inp.weight",
    "model.layers.N.mlp.router.bias": "blk.N.ffn_gate_inp.bias",
}


def write_gpt_oss_keys(w, c):
    """GptOssModel's keys: TextModel's (YaRN's with the betas rope_parameters holds) and the
    window and expert size."""
    r = c.rope_parameters
    w.add_context_length(c.max_position_embeddings)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_expert_count(c.num_local_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    if r.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(r["factor"])
        w.add_rope_scaling_orig_ctx_len(r["original_max_position_embeddings"])
        if r.get("beta_fast") is not None:
            w.add_rope_scaling_yarn_beta_fast(r["beta_fast"])
        if r.get("beta_slow") is not None:
            w.add_rope_scaling_yarn_beta_slow(r["beta_slow"])
    w.add_sliding_window(c.sliding_window)
    w.add_expert_feed_forward_length(c.intermediate_size)


def write_gpt_oss_experts(w, layer, name, p, qtype):
    """gpt-oss's fused experts as GptOssModel.modify_tensors splits them: gate_up_proj
    [E, H, 2F] transposed, its even rows ffn_gate_exps and odd ones ffn_up_exps [E, F, H];
    down_proj [E, F, H] transposed as ffn_down_exps [E, H, F]; the biases alike."""
    data = p.detach().to(torch.float32)
    blk = "blk.%s." % layer
    if name == "gate_up_proj":
        data = data.transpose(-1, -2)
        add_tensor(w, blk + "ffn_gate_exps.weight", data[:, ::2].contiguous().numpy(), qtype, qtype)
        add_tensor(w, blk + "ffn_up_exps.weight", data[:, 1::2].contiguous().numpy(), qtype, qtype)
    elif name == "gate_up_proj_bias":
        add_tensor(w, blk + "ffn_gate_exps.bias", data[..., ::2].contiguous().numpy(), qtype, qtype)
        add_tensor(w, blk + "ffn_up_exps.bias", data[..., 1::2].contiguous().numpy(), qtype, qtype)
    elif name == "down_proj":
        add_tensor(w, blk + "ffn_down_exps.weight", data.transpose(-1, -2).contiguous().numpy(),
                   qtype, qtype)
    else:
        assert name == "down_proj_bias", name
        add_tensor(w, blk + "ffn_down_exps.bias", data.numpy(), qtype, qtype)


def write_experts(w, layer, name, p, qtype):
    """transformers' fused experts of one layer as the converter stacks them: gate_up_proj
    [E, 2F, H] (gate rows first) as ffn_gate_exps and ffn_up_exps [E, F, H], down_proj [E, H, F]
    as ffn_down_exps."""
    data = p.detach().to(torch.float32).numpy()
    if name == "gate_up_proj":
        half = data.shape[1] // 2
        add_tensor(w, "blk.%s.ffn_gate_exps.weight" % layer, data[:, :half].copy(), qtype, qtype)
        add_tensor(w, "blk.%s.ffn_up_exps.weight" % layer, data[:, half:].copy(), qtype, qtype)
    else:
        add_tensor(w, "blk.%s.ffn_down_exps.weight" % layer, data, qtype, qtype)


def write_tokenizer(w, c):
    """A SentencePiece ("llama") vocabulary of vocab_size tokens: <unk>, <s>, </s> and plain
    pieces. transformers needs none of it to load the model, but the converter always writes
    one."""
    tokens = ["<unk>", "<s>", "</s>"] + ["\u2581t%d" % i for i in range(3, c.vocab_size)]
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([0.0, 0.0, 0.0] + [-float(i) for i in range(3, c.vocab_size)])
    w.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
                      + [gguf.TokenType.NORMAL] * (c.vocab_size - 3))
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if c.pad_token_id is not None:
        w.add_pad_token_id(c.pad_token_id)


def writer(path, arch, c):
    """A GGUFWriter of architecture `arch` holding the keys every converter writes: the sizes,
    head counts and the RMSNorm epsilon."""
    w = gguf.GGUFWriter(path, arch)
    w.add_name("te random " + arch)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    return w


def write_gguf(model, path, qtype, embd_qtype, experts_qtype=None):
    """model (a Llama, Phi-3, Qwen2, Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE or gpt-oss) as
    convert_hf_to_gguf.py writes it, with the 2-dim weights quantized to qtype (token_embd.weight
    to embd_qtype, the experts to experts_qtype when given) and the norms and biases in F32."""
    c = model.config
    arch = {"qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "mixtral": "llama",
            "gpt_oss": "gpt-oss"}.get(c.model_type, c.model_type)
    llama = arch == "llama"  # whose query/key rows are permuted (Mixtral's too)
    w = writer(path, arch, c)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    {"llama": write_llama_keys, "phi3": write_phi3_keys, "qwen2": write_qwen2_keys,
     "qwen3_moe": write_qwen_moe_keys, "qwen2_moe": write_qwen_moe_keys,
     "mixtral": write_mixtral_keys, "olmoe": write_olmoe_keys,
     "gpt_oss": write_gpt_oss_keys}[c.model_type](w, c)
    w.add_file_type(GGUF_FILE_TYPES[qtype])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_tokenizer(w, c)
    names = {**GGUF_NAMES, **PHI3_NAMES, **QWEN2_NAMES, **QWEN_MOE_NAMES}
    if c.model_type == "gpt_oss":
        names.update(GPT_OSS_NAMES)
    for hf_name, p in model.state_dict().items():
        if hf_name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.*)", hf_name)
        if m and m[2].startswith("mlp.experts."):
            write = write_gpt_oss_experts if c.model_type == "gpt_oss" else write_experts
            write(w, m[1], m[2][len("mlp.experts."):], p, experts_qtype or qtype)
            continue
        name = (names["model.layers.N." + m[2]].replace(".N.", ".%s." % m[1]) if m
                else names[hf_name])
        data = p.detach().to(torch.float32).numpy()
        if name.endswith("ffn_gate_inp_shexp.weight"):
            data = data.reshape(-1)  # [H], which transformers' GGUF reader takes (not [1, H])
        if llama and name.endswith("attn_q.weight"):
            data = permute(data, c.num_attention_heads)
        elif llama and name.endswith("attn_k.weight"):
            data = permute(data, c.num_key_value_heads)
        add_tensor(w, name, data, qtype, embd_qtype)
    close(w)


def add_tensor(w, name, data, qtype, embd_qtype):
    """data as the converter writes it: 1-dim tensors, routers and whatever does not end in
    .weight F32, token_embd.weight as embd_qtype, the other weights as qtype (F16 where its
    blocks do not tile a row)."""
    # The routers stay F32 (the converter forces FFN_GATE_INP to it; llama-quantize skips it).
    router = name.endswith("ffn_gate_inp.weight")
    kind = Q.F32 if data.ndim == 1 or router or not name.endswith(".weight") \
        else embd_qtype if name == "token_embd.weight" else qtype
    if kind != Q.F32 and data.shape[-1] % gguf.GGML_QUANT_SIZES[kind][0]:
        kind = Q.F16  # a row the blocks do not tile (ffn_down's intermediate_size 48)
    w.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)


def close(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# Gemma 2's and 3's names as llama.cpp's converter writes them (gguf-py MODEL_ARCH.GEMMA2's and
# GEMMA3's tensors; the q/k norms are Gemma 3's).
GEMMA_NAMES = {
    "model.layers.N.self_attn.q_norm.weight": "blk.N.attn_q_norm.weight",
    "model.layers.N.self_attn.k_norm.weight": "blk.N.attn_k_norm.weight",
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "model.layers.N.input_layernorm.weight": "blk.N.attn_norm.weight",
    "model.layers.N.self_attn.q_proj.weight": "blk.N.attn_q.weight",
    "model.layers.N.self_attn.k_proj.weight": "blk.N.attn_k.weight",
    "model.layers.N.self_attn.v_proj.weight": "blk.N.attn_v.weight",
    "model.layers.N.self_attn.o_proj.weight": "blk.N.attn_output.weight",
    "model.layers.N.post_attention_layernorm.weight": "blk.N.post_attention_norm.weight",
    "model.layers.N.pre_feedforward_layernorm.weight": "blk.N.ffn_norm.weight",
    "model.layers.N.post_feedforward_layernorm.weight": "blk.N.post_ffw_norm.weight",
    "model.layers.N.mlp.gate_proj.weight": "blk.N.ffn_gate.weight",
    "model.layers.N.mlp.up_proj.weight": "blk.N.ffn_up.weight",
    "model.layers.N.mlp.down_proj.weight": "blk.N.ffn_down.weight",
}


def write_gemma_gguf(model, path, qtype, arch):
    """model (a tied Gemma2ForCausalLM or Gemma3ForCausalLM) as llama.cpp's converter writes it
    (conversion/gemma.py Gemma2Model, Gemma3Model): its metadata, every norm weight plus one, no
    output.weight, the 2-dim weights quantized to qtype, no query/key permutation."""
    c = model.config
    w = writer(path, arch, c)
    w.add_context_length(c.max_position_embeddings)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_file_type(GGUF_FILE_TYPES[qtype])
    if arch == "gemma2":
        w.add_attn_logit_softcapping(c.attn_logit_softcapping)
        w.add_final_logit_softcapping(c.final_logit_softcapping)
    else:  # TextModel.set_gguf_parameters' global and sliding (swa) bases
        w.add_rope_freq_base(c.rope_parameters["full_attention"]["rope_theta"])
        w.add_rope_freq_base_swa(c.rope_parameters["sliding_attention"]["rope_theta"])
    w.add_sliding_window(c.sliding_window)
    w.add_vocab_size(c.vocab_size)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_tokenizer(w, c)
    for hf_name, p in model.state_dict().items():
        if hf_name == "lm_head.weight":
            continue
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.*)", hf_name)
        name = (GEMMA_NAMES["model.layers.N." + m[2]].replace(".N.", ".%s." % m[1]) if m
                else GEMMA_NAMES[hf_name])
        data = p.detach().to(torch.float32)
        if name.endswith("norm.weight"):
            data = data + 1
        add_tensor(w, name, data.numpy(), qtype, qtype)
    close(w)
