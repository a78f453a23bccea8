// The decoder families te-cpp builds, one line each, in the order errors and --help list them.
// A new family: its file in this folder (defining `const Family& <name>_family()`, see
// family.h), its line here, and its tests. No include guard: family.h and registry.cpp include
// this list with their own TE_HF_FAMILY.
TE_HF_FAMILY(llama)
TE_HF_FAMILY(mistral)
TE_HF_FAMILY(mixtral)
TE_HF_FAMILY(qwen2)
TE_HF_FAMILY(qwen3)
TE_HF_FAMILY(qwen2_moe)
TE_HF_FAMILY(qwen3_moe)
TE_HF_FAMILY(olmoe)
TE_HF_FAMILY(gpt_oss)
TE_HF_FAMILY(phi3)
TE_HF_FAMILY(gemma)
TE_HF_FAMILY(gemma2)
TE_HF_FAMILY(gemma3)
TE_HF_FAMILY(gpt2)
