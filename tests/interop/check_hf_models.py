"""Holds te's Hugging Face loader to transformers on small random decoder models: for each family
below (and GPT-2's GPT2LMHeadModel) it builds a float32 *ForCausalLM from a random config (eager attention, no dropout, norm
scales and biases moved off their initial values), saves it with save_pretrained (config.json and
model.safetensors), writes two rows of random token ids and runs

  BINARY --model WORKDIR/<case> --ids WORKDIR/<case>/ids.json --out WORKDIR/<case>/te.json

The BERT cases (ENCODERS) build a random BertModel (with its pooler), pad the second row of ids,
give random token types and run the binary with --encoder: "logits" are then the last hidden
states with padded rows zeroed, "pooled" the pooler's output, and the loss
sum(mean_pool(h) * cos(i)) + sum(pooled * sin(i)) (see encoder_reference).

te.json is {"layouts": {LAYOUT: {"logits": T, "loss": float, "grads": {HF name: T}}}} with T as
cases.h's as_json writes it. Every layout is held to the model's own forward and backward: the
logits, the mean next-token cross-entropy and the gradient of every parameter
model.named_parameters() lists (a tied lm_head is not listed; its gradient is the embedding's).
A parameter te leaves out, or a gradient te names that the model has not, fails the layout.
Within 1e-5. A GGUF case adds the layout "one-blocks" ({"logits": T, "inference_only": true,
"held_blocks": N}): the file as te loads it by default on one process, its quantized weights
held in their blocks; its logits alone are held to the model's, and N must not be 0.

The GGUF cases (GGUF_CASES) build a random model of a family llama.cpp converts the same way,
write it with gguf-py as llama.cpp's convert_hf_to_gguf.py writes it (gguf_files.py: its
metadata, a minimal tokenizer, Llama's attn_q and attn_k rows permuted, Phi-3's fused tensors,
the experts stacked, the 2-dim weights quantized) to WORKDIR/<case>/model.gguf and pass that file
as --model. Quantizing changes the weights, so there the reference is not the float model but
what transformers loads from the file (from_pretrained(..., gguf_file=), or its steps by hand
where accelerate, which it insists on, is missing: see from_gguf), or, for the families whose
files transformers' GGUF reader cannot read (Mixtral, OLMoE, gpt-oss), the file's tensors as
gguf-py dequantizes them mapped back by hand; te's gradients are still keyed by the Hugging Face
names.

  python check_hf_models.py BINARY WORKDIR
"""

import json
import os
import subprocess
import sys

# load_gguf_checkpoint's progress bar is tqdm's own, which transformers' disable_progress_bar does
# not reach; tqdm reads this once, when it is first imported (by what follows).
os.environ.setdefault("TQDM_DISABLE", "1")

import safetensors.torch
import torch
import transformers
from gguf import GGMLQuantizationType as Q
from gguf_files import write_gemma_gguf, write_gguf
from interop_common import TOL, print_failure, rel_err, tensor
from transformers import (AutoConfig, AutoModelForCausalLM, BertConfig, BertModel, GPT2Config,
                          GPT2LMHeadModel, GemmaConfig, GemmaForCausalLM, Gemma2Config,
                          Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, GptOssConfig,
                          GptOssForCausalLM, LlamaConfig,
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM, MixtralConfig,
                          MixtralForCausalLM, OlmoeConfig, OlmoeForCausalLM, Phi3Config,
                          Phi3ForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
from transformers.utils import is_accelerate_available

BATCH, SEQ, VOCAB = 2, 12, 128

SIZES = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
             rms_norm_eps=1e-6, attention_dropout=0.0, attn_implementation="eager")


def rope(theta, rope_type="default", **extra):
    return {"rope_parameters": dict(rope_type=rope_type, rope_theta=theta, **extra)}


# Llama 3.1's RoPE scaling: head_dim 8 has wavelengths 6.3, 63 and 628, 6283 at theta 1e4, so
# original_max_position_embeddings 64 (high band below 16, low band above 64) puts one frequency
# unchanged, one smoothed and two divided by the factor.
LLAMA3_ROPE = rope(10000.0, "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)

YARN_ROPE = rope(100.0, "yarn", factor=2.0, original_max_position_embeddings=32)
# LongRoPE's factors for head_dim 8 (4 pairs).
SHORT, LONG = [1.0, 1.25, 2.0, 4.0], [1.5, 3.0, 8.0, 24.0]

# (case, config class, model class, config arguments beyond SIZES)
FAMILIES = [
    # pad_token_id: the embedding's row 0 gets no gradient from the lookup (token_ids has a 0).
    ("llama", LlamaConfig, LlamaForCausalLM,
     dict(tie_word_embeddings=False, pad_token_id=0, **rope(10000.0))),
    ("llama-llama3-rope", LlamaConfig, LlamaForCausalLM,
     dict(tie_word_embeddings=False, **LLAMA3_ROPE)),
    ("llama-tied-linear-rope", LlamaConfig, LlamaForCausalLM,
     dict(tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
          **rope(500.0, "linear", factor=2.0))),
    # SEQ > sliding_window, so the window cuts keys off.
    ("mistral", MistralConfig, MistralForCausalLM,
     dict(tie_word_embeddings=False, sliding_window=4, **rope(10000.0))),
    ("qwen2", Qwen2Config, Qwen2ForCausalLM,
     dict(tie_word_embeddings=True, use_sliding_window=False, **rope(10000.0))),
    # Layer 0 full, layer 1 sliding (max_window_layers 1; saved as layer_types).
    ("qwen2-sliding", Qwen2Config, Qwen2ForCausalLM,
     dict(tie_word_embeddings=False, use_sliding_window=True, sliding_window=4,
          max_window_layers=1, **rope(10000.0))),
    # head_dim 16 is not hidden_size / heads (8).
    ("qwen3", Qwen3Config, Qwen3ForCausalLM,
     dict(tie_word_embeddings=False, head_dim=16, attention_bias=False, **rope(10000.0))),
    # YaRN: theta 100 puts the correction range of 32 and 1 rotations in 32 positions at dims
    # [0, 2] (truncated): factors 1, 1 / (0.5 / 2 + 0.5), 2, 2; attention factor 0.1 ln 2 + 1.
    ("llama-yarn-rope", LlamaConfig, LlamaForCausalLM,
     dict(tie_word_embeddings=False, **YARN_ROPE)),
    # YaRN untruncated, with its betas and mscales: a ramp of 0, 0.71, 1, 1; attention factor
    # get_mscale(4, 1) / get_mscale(4, 0.5).
    ("qwen2-yarn-rope-betas-mscale", Qwen2Config, Qwen2ForCausalLM,
     dict(tie_word_embeddings=True, use_sliding_window=False,
          **rope(100.0, "yarn", factor=4.0, original_max_position_embeddings=16, beta_fast=4.0,
                 beta_slow=0.5, mscale=1.0, mscale_all_dim=0.5, truncate=False))),
    # LongRoPE on a Llama (transformers' shared rotary embedding): SEQ 12 > 8, the long factors;
    # an explicit attention_factor.
    ("llama-longrope", LlamaConfig, LlamaForCausalLM,
     dict(tie_word_embeddings=False, **rope(10000.0, "longrope", short_factor=SHORT,
                                            long_factor=LONG, original_max_position_embeddings=8,
                                            attention_factor=1.3))),
    # Phi-3: qkv_proj and gate_up_proj split into te's kernels (each rank its rows); the window
    # shorter than the sequence; pad_token_id given (Phi3Config's default 32000 is outside VOCAB).
    ("phi3", Phi3Config, Phi3ForCausalLM,
     dict(tie_word_embeddings=False, pad_token_id=0, sliding_window=4, **rope(10000.0))),
    # LongRoPE (Phi-3.5's long context): SEQ 12 > original_max_position_embeddings 8, so the long
    # factors; attention factor sqrt(1 + ln(64 / 8) / ln 8) from max_position_embeddings 64.
    ("phi3-longrope-long-tied", Phi3Config, Phi3ForCausalLM,
     dict(tie_word_embeddings=True, pad_token_id=0, original_max_position_embeddings=8,
          **rope(10000.0, "longrope", short_factor=SHORT, long_factor=LONG))),
    # SEQ 12 <= 16: the short factors, on half the head (partial_rotary_factor 0.5: 2 pairs).
    ("phi3-longrope-short-partial", Phi3Config, Phi3ForCausalLM,
     dict(tie_word_embeddings=False, pad_token_id=0, original_max_position_embeddings=16,
          **rope(10000.0, "longrope", short_factor=[1.2, 3.0], long_factor=[2.0, 9.0],
                 partial_rotary_factor=0.5))),
    # Gemma (1): head_dim 16 not hidden_size / heads, GQA, a tied head.
    ("gemma", GemmaConfig, GemmaForCausalLM, dict(head_dim=16, pad_token_id=0, **rope(10000.0))),
    # Gemma 2: layer 0 slides (window 4 < SEQ), layer 1 attends to all; head_dim 16 is not
    # hidden_size / heads; soft caps near these small random models' logits (attention ~0.02,
    # head ~0.1), so tanh bends them: without either cap the case fails.
    ("gemma2", Gemma2Config, Gemma2ForCausalLM,
     dict(head_dim=16, query_pre_attn_scalar=12, sliding_window=4, attn_logit_softcapping=0.05,
          final_logit_softcapping=0.5, pad_token_id=0, **rope(10000.0))),
    # A separate head, q/k/v/o biases, no soft caps, both layers sliding, linear RoPE.
    ("gemma2-untied-bias-nocap", Gemma2Config, Gemma2ForCausalLM,
     dict(head_dim=8, query_pre_attn_scalar=8, sliding_window=5, attn_logit_softcapping=None,
          final_logit_softcapping=None, tie_word_embeddings=False, attention_bias=True,
          pad_token_id=None, layer_types=["sliding_attention"] * 2,
          **rope(500.0, "linear", factor=2.0))),
    # Gemma 3: q/k norms; layer 0 slides with its own RoPE (base 100), layer 1 is global with
    # linear scaling (base 5000). (No attention soft cap: Gemma3Attention never applies it.)
    ("gemma3", Gemma3TextConfig, Gemma3ForCausalLM,
     dict(head_dim=16, query_pre_attn_scalar=12, sliding_window=4,
          layer_types=["sliding_attention", "full_attention"], pad_token_id=0,
          rope_parameters={"full_attention": dict(rope_type="linear", factor=2.0,
                                                  rope_theta=5000.0),
                           "sliding_attention": dict(rope_type="default", rope_theta=100.0)})),
    # Gemma3TextConfig's RoPE bases (1e6 global, 1e4 sliding), sliding_window_pattern 2 (saved
    # as layer_types), a separate head, q/k/v/o biases, a head soft cap.
    ("gemma3-pattern-untied-bias", Gemma3TextConfig, Gemma3ForCausalLM,
     dict(head_dim=8, query_pre_attn_scalar=8, sliding_window=5, sliding_window_pattern=2,
          final_logit_softcapping=0.5, tie_word_embeddings=False, attention_bias=True)),
]

# Mixtures of experts, held on one process and on the expert-parallel layouts too (ep2, dp2xep2,
# ep2xtp2). 4 experts, 2 per token; the random router spreads these 24 tokens over all four;
# transformers' eager experts (a loop over the hit experts) as the reference.
MOE = dict(num_experts_per_tok=2, experts_implementation="eager")
FAMILIES += [
    # Renormalised top-2 (norm_topk_prob), every layer sparse; the loss counts the routers'
    # load-balancing loss over both layers (output_router_logits), weighted up to show in every
    # gradient.
    ("qwen3-moe", Qwen3MoeConfig, Qwen3MoeForCausalLM,
     dict(MOE, num_experts=4, moe_intermediate_size=16, norm_topk_prob=True,
          output_router_logits=True, router_aux_loss_coef=0.5,
          tie_word_embeddings=False, **rope(10000.0))),
    # The top-2 of the softmax as they are; layer 0 dense (mlp_only_layers: no router, so the
    # load-balancing loss is layer 1's alone); a shared expert of 24 with its sigmoid gate; q/k/v
    # biases.
    ("qwen2-moe-shared-dense-layer", Qwen2MoeConfig, Qwen2MoeForCausalLM,
     dict(MOE, num_experts=4, moe_intermediate_size=16, shared_expert_intermediate_size=24,
          norm_topk_prob=False, mlp_only_layers=[0], use_sliding_window=False,
          output_router_logits=True, router_aux_loss_coef=0.3,
          tie_word_embeddings=False, **rope(10000.0))),
    # Experts of intermediate_size (48), w1/w3/w2 under block_sparse_moe; a window of 4.
    ("mixtral", MixtralConfig, MixtralForCausalLM,
     dict(MOE, num_local_experts=4, sliding_window=4, tie_word_embeddings=False,
          **rope(10000.0))),
    # OLMoE: each token's whole query and key RMS-normed (across the heads, which tp2 splits),
    # clip_qkv 0.5 clamping many of the normed queries and keys (RMS about 1) and some values,
    # q/k/v/o biases, the top-2 of the softmax as they are; the router term in the loss.
    ("olmoe", OlmoeConfig, OlmoeForCausalLM,
     dict(MOE, num_experts=4, clip_qkv=0.5, attention_bias=True, norm_topk_prob=False,
          output_router_logits=True, router_aux_loss_coef=0.2, tie_word_embeddings=False,
          **rope(10000.0))),
    # gpt-oss: its config class's own RoPE (no rope_parameters given: yarn, factor 32 over 4096
    # positions, base 150000, truncate false, which head_dim 8 tells from truncating), a window of
    # 4 on layer 0, sinks, biases everywhere, the router's bias, the fused experts saved as they
    # are; a SwiGLU limit of 0.1 clamps many of these small pre-activations (std about 0.15).
    ("gpt-oss", GptOssConfig, GptOssForCausalLM,
     dict(MOE, num_local_experts=4, head_dim=8, sliding_window=4, swiglu_limit=0.1,
          swiglu_alpha=2.0, output_router_logits=True, router_aux_loss_coef=0.5,
          tie_word_embeddings=False)),
]


def checkpoint_names(model, grads):
    """The gradients under the names save_pretrained gives the tensors: transformers keeps each
    sparse layer's experts fused in memory (mlp.experts.gate_up_proj [E, 2I, H], gate rows first,
    and mlp.experts.down_proj [E, H, I]) and writes them per expert (Mixtral's as
    block_sparse_moe.experts.N.w1/w3/w2, its router as block_sparse_moe.gate). gpt-oss's are
    saved as they are in memory."""
    if model.config.model_type == "gpt_oss":
        return grads
    mixtral = model.config.model_type == "mixtral"
    block = "block_sparse_moe." if mixtral else "mlp."
    gate, up, down = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    out = {}
    for name, g in grads.items():
        head, sep, tail = name.partition("mlp.")
        if not sep or not (tail.startswith("experts.") or tail == "gate.weight"):
            out[name] = g
        elif tail == "gate.weight":
            out[head + block + "gate.weight"] = g
        elif tail == "experts.gate_up_proj":
            half = g.shape[1] // 2
            for e in range(g.shape[0]):
                out["%s%sexperts.%d.%s.weight" % (head, block, e, gate)] = g[e, :half]
                out["%s%sexperts.%d.%s.weight" % (head, block, e, up)] = g[e, half:]
        elif tail == "experts.down_proj":
            for e in range(g.shape[0]):
                out["%s%sexperts.%d.%s.weight" % (head, block, e, down)] = g[e]
        else:
            raise ValueError("unexpected expert parameter " + name)
    return out


# GPT-2 (GPT2LMHeadModel: learned positions, pre-LayerNorm, Conv1D weights, a tied head): (case,
# config arguments beyond GPT2_SIZES); checked as the decoders above.
GPT2_SIZES = dict(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager")
GPT2 = [
    ("gpt2", dict(activation_function="gelu_new", layer_norm_epsilon=1e-5)),
    # pad_token_id: GPT-2's wte has no padding_idx, so row 0 (token_ids has a 0) still trains.
    ("gpt2-inner-gelu-pad", dict(activation_function="gelu", n_inner=48, pad_token_id=0,
                                 layer_norm_epsilon=1e-6)),
    # An untied head (lm_head.weight, an nn.Linear), and the tensors named as openai-community/
    # gpt2's checkpoint names them: without the "transformer." prefix (see BARE).
    ("gpt2-untied-bare-names", dict(tie_word_embeddings=False)),
]
BARE = {"gpt2-untied-bare-names"}


def strip_transformer_prefix(folder):
    """Rewrites folder/model.safetensors with "transformer." taken off every name."""
    path = os.path.join(folder, "model.safetensors")
    tensors = safetensors.torch.load_file(path)
    safetensors.torch.save_file({k[len("transformer."):] if k.startswith("transformer.") else k: v
                                 for k, v in tensors.items()}, path, metadata={"format": "pt"})


# BERT encoders (BertModel, with its pooler): (case, config arguments beyond ENCODER_SIZES).
# te runs them with --encoder; the second row of ids is padded (attention_mask 0) at its end.
ENCODER_SIZES = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=48, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, attn_implementation="eager")
ENCODERS = [
    ("bert", dict(hidden_act="gelu", type_vocab_size=2, layer_norm_eps=1e-12)),
    ("bert-gelu-new-3-types", dict(hidden_act="gelu_new", type_vocab_size=3, layer_norm_eps=1e-5)),
]
PAD = 4


# (case, config class, model class, type of the 2-dim weights, type of token_embd.weight, config
# arguments beyond SIZES), written by gguf_files.py. Rows of hidden_size 32 are one 32-wide
# block; ffn_down's rows of intermediate_size 48 are not whole blocks and go F16. A tied file has
# no output.weight, so its logits come off the F32 embedding table; it names a padding token
# (tokenizer.ggml.padding_token_id).
GGUF_CASES = [
    ("llama-gguf-q8_0", LlamaConfig, LlamaForCausalLM, Q.Q8_0, Q.Q8_0,
     dict(tie_word_embeddings=False, **rope(10000.0))),
    ("llama-gguf-q4_1-tied", LlamaConfig, LlamaForCausalLM, Q.Q4_1, Q.F32,
     dict(tie_word_embeddings=True, pad_token_id=0, **rope(10000.0))),
    # Llama 3's scaling as llama.cpp writes it: the factors in rope_freqs.weight.
    ("llama-gguf-q8_0-llama3-rope", LlamaConfig, LlamaForCausalLM, Q.Q8_0, Q.Q8_0,
     dict(tie_word_embeddings=False, **LLAMA3_ROPE)),
    # Phi-3: attn_qkv and ffn_up fused; its sliding_window, which llama.cpp and transformers'
    # GGUF loader both leave off (full attention).
    ("phi3-gguf-q8_0", Phi3Config, Phi3ForCausalLM, Q.Q8_0, Q.Q8_0,
     dict(tie_word_embeddings=False, pad_token_id=0, sliding_window=4, **rope(10000.0))),
    # Mixtures of experts as llama.cpp's converter stacks them (ffn_{gate,up,down}_exps, F32
    # router ffn_gate_inp): Qwen3-MoE renormalising its top 2 (llama.cpp's qwen3moe graph does, and
    # GGUF has no norm_topk_prob); Qwen2-MoE not, with its shared expert (ffn_*_shexp) and gate
    # (ffn_gate_inp_shexp [H]). GGUF has no dense layers: every layer sparse.
    ("qwen3-moe-gguf-q8_0", Qwen3MoeConfig, Qwen3MoeForCausalLM, Q.Q8_0, Q.Q8_0,
     dict(MOE, num_experts=4, moe_intermediate_size=16, norm_topk_prob=True,
          tie_word_embeddings=False, **rope(10000.0))),
    # Mixtral as llama.cpp writes it: a "llama" file with llama.expert_count, q/k rows permuted,
    # experts of feed_forward_length (48: ffn_down's rows go F16). transformers' GGUF reader
    # cannot read it (its config is LlamaConfig): the reference is the file read by hand
    # (moe_from_gguf).
    ("mixtral-gguf-q8_0", MixtralConfig, MixtralForCausalLM, Q.Q8_0, Q.Q8_0,
     dict(MOE, num_local_experts=4, tie_word_embeddings=False, **rope(10000.0))),
    # OLMoE as llama.cpp writes it ("olmoe": rows as transformers', the q/k norms over each token's
    # whole query and key; llama.cpp sizes attn_k_norm by embedding_length, so the key/value heads
    # are all four, and OlmoeModel writes the norm epsilon 1e-5): experts of feed_forward_length,
    # the top 2 never renormalised (llama.cpp's olmoe graph). transformers reads no OLMoE GGUF file:
    # the reference is the file read by hand (moe_from_gguf).
    ("olmoe-gguf-q8_0", OlmoeConfig, OlmoeForCausalLM, Q.Q8_0, Q.Q8_0,
     dict(MOE, num_experts=4, norm_topk_prob=False, tie_word_embeddings=False,
          sizes=dict(num_key_value_heads=4, rms_norm_eps=1e-5), **rope(10000.0))),
    ("qwen2-moe-gguf-q4_1", Qwen2MoeConfig, Qwen2MoeForCausalLM, Q.Q4_1, Q.Q8_0,
     dict(MOE, num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=24,
          norm_topk_prob=False, use_sliding_window=False, tie_word_embeddings=False,
          **rope(10000.0))),
    # gpt-oss as llama.cpp writes it ("gpt-oss"): its experts in MXFP4 (what GptOssModel repacks
    # OpenAI's checkpoints into; intermediate_size 64 so that ffn_down_exps' rows are whole
    # blocks too), their biases and the router's F32, sinks, YaRN from the rope.scaling keys,
    # which llama.cpp always truncates (ggml_rope_yarn_corr_dims): the model is built with
    # truncate true. Its betas put the ramp on head_dim 8's second pair, which turns 0.1 rad per
    # position: truncated it is divided by 1.94, not 3.23, and these 12 positions tell the two
    # apart (gpt-oss's own betas, 32 and 1 at base 150000, move only a pair that turns 0.0026).
    # transformers' GGUF reader does not read llama.cpp's expert tensors: the reference is the
    # file read by hand (gpt_oss_from_gguf).
    ("gpt-oss-gguf-mxfp4", GptOssConfig, GptOssForCausalLM, Q.Q8_0, Q.Q8_0,
     dict(MOE, num_local_experts=4, head_dim=8, sliding_window=4, tie_word_embeddings=False,
          sizes=dict(intermediate_size=64), experts_qtype=Q.MXFP4,
          **rope(10000.0, "yarn", factor=32.0, beta_fast=206.0, beta_slow=41.0, truncate=True,
                 original_max_position_embeddings=4096))),
    # LongRoPE as llama.cpp writes it: rope_factors_long/short.weight and rope.scaling.attn_factor
    # (SEQ 12 > 8: the long factors).
    ("phi3-gguf-q4_1-tied-longrope", Phi3Config, Phi3ForCausalLM, Q.Q4_1, Q.F32,
     dict(tie_word_embeddings=True, pad_token_id=0, original_max_position_embeddings=8,
          **rope(10000.0, "longrope", short_factor=SHORT, long_factor=LONG))),
]
def build(config_class, model_class, kwargs, seed, sizes=SIZES):
    """The random model, with every norm scale and bias moved off its initial value."""
    torch.manual_seed(seed)
    model = model_class(config_class(**sizes, **kwargs)).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() and name.endswith(".weight"):
                p.add_(0.2 * torch.randn_like(p))
            elif name.endswith(".bias") or name.endswith("_bias") or name.endswith(".sinks"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def check_gemma_gguf_case(binary, workdir, index, case, qtype, arch):
    """A random Gemma 2 or 3 (its config class's defaults but the sizes, head_dim 16 and a window
    of 4; Gemma 3 with 6 layers, so that its default pattern makes layer 5 global) written as
    WORKDIR/<case>/model.gguf, held to what transformers loads from that file."""
    seed = 1000 + index
    config, model_class, sizes = ((Gemma2Config, Gemma2ForCausalLM, SIZES) if arch == "gemma2"
                                  else (Gemma3TextConfig, Gemma3ForCausalLM,
                                        dict(SIZES, num_hidden_layers=6)))
    model = build(config, model_class, dict(head_dim=16, sliding_window=4), seed, sizes)
    folder = os.path.join(workdir, case)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.gguf")
    write_gemma_gguf(model, path, qtype, arch)
    ids = token_ids(seed)
    with open(os.path.join(folder, "ids.json"), "w") as f:
        json.dump({"ids": ids.tolist()}, f)
    layouts = run_te(binary, folder, path)
    logits, loss, grads = reference(from_gguf(folder, "model.gguf"), ids)
    return [(name, *check_layout(te, logits, loss, grads)) for name, te in layouts.items()]


def token_ids(seed):
    """Random ids, with token 0 (the padding row where a config names one) among them."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    ids[0, 2] = 0
    return ids


def run_te(binary, folder, model_path=None, extra=()):
    """te.json's layouts for the model at model_path (default: folder itself), or raises
    RuntimeError with the binary's complaint (its stderr)."""
    out = os.path.join(folder, "te.json")
    cmd = [binary, "--model", model_path or folder, "--ids", os.path.join(folder, "ids.json"),
           "--out", out, *extra]
    try:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True)
    except subprocess.CalledProcessError as e:
        raise RuntimeError("%s exited with status %d\n%s" % (binary, e.returncode, e.stderr))
    except OSError as e:
        raise RuntimeError("could not run %s: %s" % (binary, e))
    try:
        layouts = json.load(open(out))["layouts"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RuntimeError("could not read layouts from %s: %r" % (out, e))
    if not layouts:
        raise RuntimeError("%s holds no layouts" % out)
    return layouts


def reference(model, ids):
    """transformers' logits, mean next-token loss and parameter gradients, in float64. A mixture
    of experts with output_router_logits: transformers' own loss, the cross-entropy plus
    router_aux_loss_coef times its load_balancing_loss_func."""
    model.eval()
    model.zero_grad()
    if getattr(model.config, "output_router_logits", False):
        out = model(input_ids=ids, labels=ids)
        logits, loss = out.logits, out.loss
        assert out.aux_loss is not None and out.aux_loss.item() > 0
    else:
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 ids[:, 1:].reshape(-1))
    loss.backward()
    grads = {name: p.grad.to(torch.float64) for name, p in model.named_parameters()}
    return logits.detach().to(torch.float64), loss.item(), checkpoint_names(model, grads)


def compare(what, mine, want, problems):
    """rel_err of te's tensor `mine` (JSON) against `want`; inf, noted in problems, when te
    wrote no such tensor or one of another shape."""
    if mine is None:
        problems.append("no %s" % what)
        return float("inf")
    t = tensor(mine)
    if t.shape != want.shape:
        problems.append("%s has shape %s, not %s" % (what, list(t.shape), list(want.shape)))
        return float("inf")
    return rel_err(t, want)


def check_layout(te, logits, loss, grads, pooled=None):
    """({what: error}, [problems]) for one layout te wrote. An inference-only layout (a GGUF
    file's weights held in their blocks) has logits only, and must hold some weights so."""
    problems = []
    errors = {"logits": compare("logits", te.get("logits"), logits, problems)}
    if te.get("inference_only"):
        if not te.get("held_blocks"):
            problems.append("no weight held in GGUF blocks")
        return errors, problems
    if pooled is not None:
        errors["pooled"] = compare("pooled", te.get("pooled"), pooled, problems)
    if "loss" in te:
        errors["loss"] = abs(te["loss"] - loss) / max(1.0, abs(loss))
    else:
        errors["loss"] = float("inf")
        problems.append("no loss")
    got = te.get("grads", {})
    grad_errors = {name: compare("gradient for " + name, got.get(name), want, problems)
                   for name, want in grads.items()}
    problems += ["gradient for %s, which the model has not" % n for n in got if n not in grads]
    # The largest gradient error, a NaN counting as the largest.
    worst = max(grad_errors, key=lambda n: (grad_errors[n] != grad_errors[n], grad_errors[n]))
    errors["grad (%s)" % worst] = grad_errors[worst]
    return errors, problems


def check_case(binary, workdir, index, case, config_class, model_class, kwargs, sizes=SIZES):
    """[(layout, {what: error}, [problems])] for one family; raises RuntimeError if te fails."""
    seed = 1000 + index
    model = build(config_class, model_class, kwargs, seed, sizes)
    folder = os.path.join(workdir, case)
    model.save_pretrained(folder, safe_serialization=True)
    if case in BARE:
        strip_transformer_prefix(folder)
    ids = token_ids(seed)
    with open(os.path.join(folder, "ids.json"), "w") as f:
        json.dump({"ids": ids.tolist()}, f)
    layouts = run_te(binary, folder)
    logits, loss, grads = reference(model, ids)
    return [(name, *check_layout(te, logits, loss, grads)) for name, te in layouts.items()]


def encoder_reference(model, ids, mask, types):
    """transformers' BertModel as te's --encoder writes it: the last hidden states with padded rows
    zeroed, the pooler's output, sum(mean_pool(h) * cos(i)) + sum(pooled * sin(i)) (i the hidden
    index; mean_pool as sentence-transformers') and every parameter's gradient of that, float64."""
    model.eval()
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, token_type_ids=types)
    m = mask.unsqueeze(-1).to(torch.float32)
    hidden = out.last_hidden_state * m
    mean = hidden.sum(1) / m.sum(1).clamp(min=1e-9)
    i = torch.arange(hidden.shape[-1], dtype=torch.float32)
    loss = (mean * i.cos()).sum() + (out.pooler_output * i.sin()).sum()
    loss.backward()
    grads = {name: p.grad.to(torch.float64) for name, p in model.named_parameters()}
    return (hidden.detach().to(torch.float64), loss.item(), grads,
            out.pooler_output.detach().to(torch.float64))


def check_encoder_case(binary, workdir, index, case, kwargs):
    """As check_case, for a random BertModel, padded ids and token types, te run with --encoder."""
    seed = 1000 + index
    model = build(BertConfig, BertModel, kwargs, seed, ENCODER_SIZES)
    folder = os.path.join(workdir, case)
    model.save_pretrained(folder, safe_serialization=True)
    ids = token_ids(seed)
    mask = torch.ones_like(ids)
    mask[1, SEQ - PAD:] = 0
    gen = torch.Generator().manual_seed(seed + 1)
    types = torch.randint(0, kwargs["type_vocab_size"], ids.shape, generator=gen)
    with open(os.path.join(folder, "ids.json"), "w") as f:
        json.dump({"ids": ids.tolist(), "attention_mask": mask.tolist(),
                   "token_type_ids": types.tolist()}, f)
    layouts = run_te(binary, folder, extra=["--encoder"])
    hidden, loss, grads, pooled = encoder_reference(model, ids, mask, types)
    return [(name, *check_layout(te, hidden, loss, grads, pooled))
            for name, te in layouts.items()]


def from_gguf(folder, filename):
    """The float32 model transformers loads from folder/filename: from_pretrained(gguf_file=)
    where accelerate is installed (from_pretrained refuses a GGUF file without it, and the
    reference venv has none); else the same by hand: the config AutoConfig reads off the file's
    metadata, then the tensors load_gguf_checkpoint dequantizes (gguf-py) and un-permutes, which
    is what from_pretrained's GGUF quantizer hands its loader for a Llama."""
    if is_accelerate_available():
        return AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32,
                                                    attn_implementation="eager")
    config = AutoConfig.from_pretrained(folder, gguf_file=filename)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(torch.float32)
    tensors = load_gguf_checkpoint(os.path.join(folder, filename), return_tensors=True,
                                   model_to_load=model, torch_dtype=torch.float32)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    # A tied lm_head is the embedding, which the file holds as token_embd.weight.
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError("transformers read %s from %s: missing %s, unexpected %s"
                           % (sorted(tensors), filename, sorted(set(missing) - tied),
                              sorted(unexpected)))
    return model


def gguf_weights_in(model_class, config, path):
    """A model of `config` holding the weights transformers dequantizes from the GGUF file."""
    model = model_class(config).to(torch.float32)
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model,
                                   torch_dtype=torch.float32)["tensors"]
    for factors in ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"):
        tensors.pop(factors, None)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError("transformers read %s from %s: missing %s, unexpected %s"
                           % (sorted(tensors), path, sorted(missing), sorted(unexpected)))
    return model


# The weights te holds in blocks from each MoE file on one process: per layer the query, key/
# value and output kernels and the experts' gate/up kernels (wi_kernel), the experts' down
# kernels (wo_kernel) where their rows are whole blocks (Qwen2-MoE's 32; F16 otherwise), Qwen2-
# MoE's shared gate/up; the embedding and the head.
HELD_IN_BLOCKS = {"qwen3-moe-gguf-q8_0": 2 * 4 + 2, "mixtral-gguf-q8_0": 2 * 4 + 2,
                  "olmoe-gguf-q8_0": 2 * 4 + 2, "qwen2-moe-gguf-q4_1": 2 * 6 + 2,
                  "gpt-oss-gguf-mxfp4": 2 * 5 + 2}


def moe_from_gguf(model_class, config, path):
    """A model_class (Mixtral or OLMoE) of `config` holding a GGUF file's weights as gguf-py
    dequantizes them, query and key rows un-permuted where the file is a "llama" one (Mixtral),
    ffn_gate_exps and ffn_up_exps joined into transformers' gate_up_proj (gate rows first)."""
    import gguf
    from gguf_files import GGUF_NAMES, QWEN_MOE_NAMES
    to_hf = {g: h for h, g in {**GGUF_NAMES, **QWEN_MOE_NAMES}.items()}
    state, parts = {}, {}
    reader = gguf.GGUFReader(path)
    llama = bytes(reader.fields["general.architecture"].parts[-1]).decode() == "llama"
    for t in reader.tensors:
        shape = list(reversed([int(n) for n in t.shape]))
        w = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).copy())
        layer, rest = (t.name.split(".", 2)[1:] if t.name.startswith("blk.") else (None, t.name))
        if rest in ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"):
            parts[(layer, rest)] = w
            continue
        name = to_hf["blk.N." + rest if layer else rest].replace(".N.", ".%s." % layer)
        if llama and rest in ("attn_q.weight", "attn_k.weight"):  # permute's inverse
            heads = config.num_attention_heads if rest == "attn_q.weight" else \
                config.num_key_value_heads
            w = w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).transpose(1, 2) \
                .reshape(w.shape)
        state[name] = w
    for layer in range(config.num_hidden_layers):
        get = lambda n: parts[(str(layer), "ffn_%s_exps.weight" % n)]
        prefix = "model.layers.%d.mlp.experts." % layer
        state[prefix + "gate_up_proj"] = torch.cat([get("gate"), get("up")], dim=1)
        state[prefix + "down_proj"] = get("down")
    model = model_class(config).to(torch.float32)
    model.load_state_dict(state, strict=True)
    return model


def gpt_oss_from_gguf(config, path):
    """A GptOssForCausalLM of `config` holding a gpt-oss GGUF file's weights as gguf-py
    dequantizes them (MXFP4 among them), the experts joined back as GptOssModel split them: gate
    and up rows interleaved into gate_up_proj [E, H, 2F] (the gate in the even columns) and
    transposed, ffn_down_exps transposed into down_proj [E, F, H], the biases alike."""
    import gguf
    from gguf_files import GGUF_NAMES, GPT_OSS_NAMES
    to_hf = {g: h for h, g in {**GGUF_NAMES, **GPT_OSS_NAMES}.items()}
    state, parts = {}, {}
    for t in gguf.GGUFReader(path).tensors:
        shape = list(reversed([int(n) for n in t.shape]))
        w = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).copy())
        layer, rest = (t.name.split(".", 2)[1:] if t.name.startswith("blk.") else (None, t.name))
        if "_exps." in rest:
            parts[(layer, rest)] = w
            continue
        state[to_hf["blk.N." + rest if layer else rest].replace(".N.", ".%s." % layer)] = w
    for layer in range(config.num_hidden_layers):
        get = lambda n: parts[(str(layer), n)]
        prefix = "model.layers.%d.mlp.experts." % layer
        gate, up = get("ffn_gate_exps.weight"), get("ffn_up_exps.weight")  # [E, F, H]
        state[prefix + "gate_up_proj"] = torch.stack([gate, up], dim=2).flatten(1, 2) \
            .transpose(1, 2).contiguous()
        state[prefix + "gate_up_proj_bias"] = torch.stack(
            [get("ffn_gate_exps.bias"), get("ffn_up_exps.bias")], dim=2).flatten(1, 2)
        state[prefix + "down_proj"] = get("ffn_down_exps.weight").transpose(1, 2).contiguous()
        state[prefix + "down_proj_bias"] = get("ffn_down_exps.bias")
    model = GptOssForCausalLM(config).to(torch.float32)
    model.load_state_dict(state, strict=True)
    return model


def check_gguf_case(binary, workdir, index, case, config_class, model_class, qtype, embd_qtype,
                    kwargs):
    """As check_case, for a model written as WORKDIR/<case>/model.gguf and held to what
    transformers loads from that file; with RoPE scaling, which transformers' GGUF reader does not
    take from the file (rope_freqs.weight, rope_factors_*.weight), or experts, whose sizes it does
    not read, the weights it loads from the file in the model's own config."""
    seed = 1000 + index
    kwargs = dict(kwargs)  # less the pseudo-arguments: SIZES changed, the experts' type
    sizes, experts_qtype = dict(SIZES, **kwargs.pop("sizes", {})), kwargs.pop("experts_qtype", None)
    model = build(config_class, model_class, kwargs, seed, sizes)
    folder = os.path.join(workdir, case)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.gguf")
    write_gguf(model, path, qtype, embd_qtype, experts_qtype)
    ids = token_ids(seed)
    with open(os.path.join(folder, "ids.json"), "w") as f:
        json.dump({"ids": ids.tolist()}, f)
    layouts = run_te(binary, folder, path)
    # transformers' GGUF reader leaves the expert sizes at its config classes' defaults, and
    # cannot read Mixtral's or OLMoE's file.
    if model_class in (MixtralForCausalLM, OlmoeForCausalLM):
        want = moe_from_gguf(model_class, model.config, path)
    elif model_class is GptOssForCausalLM:
        want = gpt_oss_from_gguf(model.config, path)
    elif kwargs["rope_parameters"]["rope_type"] == "default" and "num_experts" not in kwargs:
        want = from_gguf(folder, "model.gguf")
    else:
        want = gguf_weights_in(model_class, model.config, path)
    logits, loss, grads = reference(want, ids)
    results = [(name, *check_layout(te, logits, loss, grads)) for name, te in layouts.items()]
    for name, _, problems in results:
        held = layouts[name].get("held_blocks", 0)
        if name == "one-blocks" and held < HELD_IN_BLOCKS.get(case, 0):
            problems.append("%d weights held in blocks, not %d" % (held, HELD_IN_BLOCKS[case]))
    return results


def main(binary, workdir):
    transformers.utils.logging.disable_progress_bar()
    reference_name = "transformers " + transformers.__version__
    failures = total = 0
    cases = [(case, check_case, family) for case, *family in FAMILIES] + \
            [(case, check_gguf_case, args) for case, *args in GGUF_CASES] + \
            [("gemma2-gguf-q8_0", check_gemma_gguf_case, [Q.Q8_0, "gemma2"]),
             ("gemma3-gguf-q8_0", check_gemma_gguf_case, [Q.Q8_0, "gemma3"])] + \
            [(case, check_case, [GPT2Config, GPT2LMHeadModel, kwargs, GPT2_SIZES])
             for case, kwargs in GPT2] + \
            [(case, check_encoder_case, [kwargs]) for case, kwargs in ENCODERS]
    only = [c for c in os.environ.get("CHECK_CASES", "").split(",") if c]  # a developer's subset
    for index, (case, check, args) in enumerate(cases):
        if only and not any(c in case for c in only):
            continue
        try:
            results = check(binary, workdir, index, case, *args)
        except RuntimeError as e:
            failures, total = failures + 1, total + 1
            print_failure(case, e)
            continue
        for layout, errors, problems in results:
            bad = problems or [k for k, e in errors.items() if not e <= TOL]
            failures, total = failures + bool(bad), total + 1
            print("%s %s/%s: %s" % ("FAIL" if bad else "ok  ", case, layout,
                                    ", ".join("%s %.2g" % kv for kv in errors.items())))
            for p in problems:
                print("     %s" % p)
    if only and total == 0:
        print("CHECK_CASES=%s names no case" % ",".join(only))
        return 1
    print("%d of %d case layouts differ from %s (tolerance %g)"
          % (failures, total, reference_name, TOL))
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
