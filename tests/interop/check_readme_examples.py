"""The README's model examples, run as a new user runs them: `bash scripts/fetch-models.sh` from
the project root, then every te-generate and te-serve line of the README's "Serve a model" and
"Generate text" blocks, as written, with the built programs for the names, the fetched SmolLM2
for the placeholder DIR, and a free port for te-serve's 8080 (its curl line goes to that port).
Checks that each exits 0 and that the answers make sense: the chat example names Paris, the
streamed chat ends with [DONE] after some content.

  python check_readme_examples.py ROOT TE_GENERATE TE_SERVE WORKDIR
"""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import urllib.request

failures = []


def check(ok, what):
    print("%s %s" % ("ok  " if ok else "FAIL", what))
    if not ok:
        failures.append(what)


def readme_commands(root, heading):
    """The commands of the first sh block under `## heading`: (line, words), comments dropped."""
    text = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    section = text.split("## " + heading + "\n", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    out = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append((line.split("  #")[0].strip(), words))
    return out


def program(words, programs):
    """`words` with the README's program name replaced by the built one and DIR by SmolLM2."""
    smollm2 = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    return [programs.get(words[0], words[0])] + [smollm2 if w == "DIR" else w for w in words[1:]]


def run_generate(words, root, programs):
    r = subprocess.run(program(words, programs), cwd=root, capture_output=True, text=True,
                       timeout=600)
    check(r.returncode == 0, "%s: exit %d %s" % (" ".join(words), r.returncode,
                                                  r.stderr.strip().splitlines()[-1:]))
    sampling = [l for l in r.stderr.splitlines() if l.startswith("[te-generate] sampling:")]
    check(len(sampling) == 1, "it prints the sampling in force: %s" % sampling)
    return r.stdout


def run_serve(words, curl_line, root, programs, workdir):
    args = program(words, programs)
    args[args.index("--port") + 1] = "0"  # any free port; 8080 may be taken
    log_path = os.path.join(workdir, "te-serve.log")
    log = open(log_path, "w")
    server = subprocess.Popen(args, cwd=root, stdout=subprocess.PIPE, stderr=log, text=True)
    port = None
    seen = []
    for line in server.stdout:
        seen.append(line)
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            port = m.group(1)
            break
    check(port is not None, "%s: listening (%s)" % (" ".join(words), "".join(seen).strip()))
    check(any("sampling a request leaves out:" in l for l in seen),
          "te-serve prints the sampling defaults")
    if port is None:
        server.kill()
        return
    try:
        curl = [w.replace("localhost:8080", "127.0.0.1:" + port)
                for w in shlex.split(curl_line, comments=True)]
        if shutil.which("curl"):
            body = subprocess.run(curl, capture_output=True, text=True, timeout=300).stdout
        else:  # no curl here: the same POST
            url = next(w for w in curl if "127.0.0.1:" in w)
            data = curl[curl.index("-d") + 1].encode()
            request = urllib.request.Request(url if url.startswith("http") else "http://" + url,
                                             data=data)
            body = urllib.request.urlopen(request, timeout=300).read().decode()
        events = [l[len("data: "):] for l in body.splitlines() if l.startswith("data: ")]
        content = "".join(json.loads(e)["choices"][0]["delta"].get("content", "")
                          for e in events[:-1] if json.loads(e).get("choices"))
        check(events[-1:] == ["[DONE]"] and content.strip() != "",
              "the README's curl line streams a chat answer (%r)" % content[:80])
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def main(root, te_generate, te_serve, workdir):
    os.makedirs(workdir, exist_ok=True)
    programs = {"te-generate": te_generate, "te-serve": te_serve}
    serve = readme_commands(root, "Serve a model")
    check(serve[0][1][:2] == ["bash", "scripts/fetch-models.sh"],
          "the serving block starts with the fetch command: %s" % serve[0][0])
    r = subprocess.run(serve[0][1], cwd=root, capture_output=True, text=True, timeout=900)
    check(r.returncode == 0, "%s: exit %d %s" % (serve[0][0], r.returncode, r.stderr[-300:]))
    for name in ("SmolLM2-135M-Instruct.Q4_1.gguf", "all-MiniLM-L6-v2/config.json"):
        check(os.path.exists(os.path.join(root, "models", name)), "models/%s is there" % name)

    generate = readme_commands(root, "Generate text")
    for line, words in generate:
        check(words[0] == "te-generate", "a te-generate line: %s" % line)
        out = run_generate(words, root, programs)
        if "--chat" in words and "capital of France" in line:
            check("Paris" in out, "the chat example answers Paris: %r" % out.strip()[:200])
        else:
            check(len(out.split()) >= 5, "it writes text: %r" % out.strip()[:120])

    serve_line = [(l, w) for l, w in serve if w[0] == "te-serve"]
    curl_line = [l for l, w in serve if w[0] == "curl"]
    check(len(serve_line) == 1 and len(curl_line) == 1, "one te-serve and one curl line")
    if serve_line and curl_line:
        run_serve(serve_line[0][1], curl_line[0], root, programs, workdir)
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
