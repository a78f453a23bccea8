#!/usr/bin/env python3
"""The documents against the repository (test docs.consistent):
- README.md opens with exactly the two commands (set up + main job, set up + test suite), the
  scripts they run exist, .ci/run runs the test command as written, and the README stays short;
- every repository path a document names exists: markdown links, and `code` spans that start at
  one of the repository's top-level folders.
Prints each stale statement as FILE:LINE: what; exits 1 when there is one.

  tests/docs/check_docs.py REPO_ROOT
"""
import os
import re
import sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
problems = []


def problem(path, line, what):
    problems.append(f"{os.path.relpath(path, root)}:{line}: {what}")


readme = os.path.join(root, "README.md")
lines = open(readme, encoding="utf-8").read().split("\n")
if len(lines) > 151:
    problem(readme, len(lines), f"{len(lines) - 1} lines; the README stays within 150 (move the rest to docs/)")
# The first fenced block, right after the title.
fences = [i for i, l in enumerate(lines) if l.startswith("```")]
commands = []
if len(fences) >= 2 and fences[0] <= 3:
    for l in lines[fences[0] + 1 : fences[1]]:
        c = l.split("#", 1)[0].strip()
        if c:
            commands.append(c)
if len(commands) != 2:
    problem(readme, 1, f"does not open with exactly two commands (found {commands})")
else:
    for c in commands:
        words = c.split()
        if words[0] != "bash" or not os.path.isfile(os.path.join(root, words[1])):
            problem(readme, fences[0] + 2, f"'{c}' does not run a script of the repository")
    ci = os.path.join(root, ".ci", "run")
    ci_commands = [l.split("#", 1)[0].strip() for l in open(ci, encoding="utf-8")]
    if not any(l.endswith(commands[1]) for l in ci_commands if l):
        problem(ci, 1, f"does not run the README's test command '{commands[1]}'")

# The README's C++ example is the one tests/docs/readme_example.cpp compiles and runs.
example = os.path.join(root, "tests", "docs", "readme_example.cpp")
blocks = re.findall(r"```cpp\n(.*?)```", "\n".join(lines), re.S)
if os.path.exists(example):
    code = open(example, encoding="utf-8").read()
    marked = re.search(r"// README begin\n(.*?)// README end", code, re.S)
    if not blocks or not marked or blocks[0] != marked.group(1):
        problem(readme, 1, "the first C++ example differs from the code tests/docs/readme_example.cpp runs")

documents = [readme]
for folder in ["docs", "examples", "tools", "modules", "gen", "hf", "encoder", "serve", "tests", "bench", "scripts",
               "fuzz", "third_party"]:
    for dirpath, _, files in os.walk(os.path.join(root, folder)):
        if "/data" in dirpath[len(root):] or "__pycache__" in dirpath:
            continue
        documents += [os.path.join(dirpath, f) for f in files if f.endswith(".md")]

# (models/ is what the tests and scripts download or write, ignored by git: a document may name
# a file a script makes there.)
top = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith(".")
             and d not in ("build", "models") and not d.startswith("build-")) + [".ci"]
# Paths of other projects the documents cite (Transformer Engine's example folder).
foreign = {"examples/jax/encoder"}


def exists(doc, text):
    """A path as the documents write one: from the repository root or the document's folder, an
    installed header (`te/nn/rope.h`), or a program by its source (`bench/bench_fp8`)."""
    for base in [root, os.path.dirname(doc)] + [os.path.join(root, layer, "include") for layer in
                                                ("te", "modules", "gen", "hf", "encoder", "serve")]:
        path = os.path.join(base, text)
        if os.path.exists(path) or os.path.exists(path + ".cpp"):
            return True
    return False


link = re.compile(r"\]\(([^)\s]+)\)")
span = re.compile(r"`([^`]+)`")
for doc in documents:
    in_code = False
    for n, l in enumerate(open(doc, encoding="utf-8"), 1):
        if l.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        for target in link.findall(l):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(doc), target.split("#")[0]))
            if not os.path.exists(path):
                problem(doc, n, f"links to '{target}', which does not exist")
        for text in span.findall(l):
            text = text.strip().rstrip(".,;:")
            first = text.split("/")[0]
            if ("/" not in text or first not in top or text in foreign
                    or re.search(r"[*<>{}\s$|]|\.\.\.", text)):
                continue
            if not exists(doc, re.sub(r":\d+(-\d+)?$", "", text)):
                problem(doc, n, f"names '{text}', which does not exist")

for p in problems:
    print(p)
print(f"docs: {len(documents)} documents checked, {len(problems)} stale statement(s)")
sys.exit(1 if problems else 0)
