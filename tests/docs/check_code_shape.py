#!/usr/bin/env python3
"""The shape of the sources (test docs.code_shape): no source file in te/, modules/, gen/, hf/,
encoder/, serve/, train/, examples/ or tools/ over 500 lines, no function there over 80 lines, and
no scope stack rolled by hand (a thread-local container of scopes outside te/scope_stack.h), and
no loop split with at::parallel_for / at::parallel_reduce in a file that does not include
te/runtime/parallel.h (which stops the build of one not compiled with OpenMP, where the loop would
run on one thread: cmake/TeParallel.cmake); tests,
benchmarks and fuzz targets are exempt. Prints each offender as FILE:LINE: what, and with --counts
the figures themselves; exits 1 when there is an offender.

  tests/docs/check_code_shape.py REPO_ROOT [--counts]

A function is a brace block that follows a parameter list at namespace or class level (member
functions, free functions, lambdas bound at namespace level); its length runs from the first
line of its declaration to its closing brace.
"""
import os
import re
import sys

MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80
SOURCE_DIRS = ("te", "modules", "gen", "hf", "encoder", "serve", "train", "examples", "tools")
SOURCE_EXTENSIONS = (".cpp", ".cc", ".cu", ".h", ".cuh")
CONTAINER = re.compile(r"\b(namespace|class|struct|union|enum)\b|\bextern\s*\"")
# A brace in a constructor's member-initialiser list: `) : a_(a), b_{`.
MEMBER_INIT = re.compile(r"\)[^;{}]*(?<!:):(?!:)[^;{}]*[\w>]\s*$")


def strip(text):
    """Comments and string/char literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # digit separator 1'000
                out.append(c)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """(name, first line, last line) of every function body in the text (comments stripped)."""
    # Preprocessor lines (with their continuations) blanked: they hold no braces of their own.
    code = re.sub(r"(?m)^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", lambda m: re.sub(r"[^\n]", " ", m.group(0)),
                  strip(text))
    line_of = [0] * (len(code) + 1)
    line = 1
    for k, ch in enumerate(code):
        line_of[k] = line
        if ch == "\n":
            line += 1
    line_of[len(code)] = line
    found = []
    # Stack of ("container" | "function" | "block", header start); a function body's inner braces
    # are blocks.
    stack = []
    header_start = 0
    paren = 0  # parentheses open in the current header (a default argument's `= {}` is inside)
    for k, ch in enumerate(code):
        if ch in "()" and not any(kind not in ("container", "init") for kind, _, _ in stack):
            paren += 1 if ch == "(" else -1
        if ch == "{":
            inside_function = any(kind not in ("container", "init") for kind, _, _ in stack)
            header = code[header_start:k]
            if inside_function:
                stack.append(("block", k, ""))
            elif paren > 0:
                stack.append(("init", k, ""))  # a brace inside the parameter list or an initialiser
                continue
            elif CONTAINER.search(header) and "(" not in header:
                stack.append(("container", k, ""))
            elif not header.rstrip().endswith("}") and MEMBER_INIT.search(
                    re.sub(r"\{[^{}]*\}", "", header)):
                stack.append(("init", k, ""))  # the body's header goes on after it
                continue
            elif "(" in header and not header.rstrip().endswith("="):
                name = re.findall(r"([~\w:<>]+)\s*\(", header)
                first = header_start + len(header) - len(header.lstrip())
                stack.append(("function", first, name[0] if name else "?"))
            else:
                stack.append(("block", k, ""))  # an initialiser at namespace level
            header_start = k + 1
            paren = 0
        elif ch == "}":
            if stack:
                kind, first, name = stack.pop()
                if kind == "function":
                    found.append((name, line_of[first], line_of[k]))
                if kind == "init":
                    continue
            header_start = k + 1
            paren = 0
        elif ch == ";" and not any(kind != "container" for kind, _, _ in stack):
            header_start = k + 1
            paren = 0
        elif ch in ":" and not any(kind != "container" for kind, _, _ in stack):
            # access specifiers (public:) end a header; '::' does not
            before = code[header_start:k].strip()
            if before in ("public", "private", "protected") and code[k + 1 : k + 2] != ":":
                header_start = k + 1
    return found


def sources(root, dirs=SOURCE_DIRS):
    for top in dirs:
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if name.endswith(SOURCE_EXTENSIONS):
                    yield os.path.join(dirpath, name)


def check(root, dirs):
    """(problems, files, long files, long functions, hand-rolled stacks) of the sources in dirs."""
    problems = []
    files = long_files = long_functions = stacks = 0
    for path in sources(root, dirs):
        rel = os.path.relpath(path, root)
        text = open(path, encoding="utf-8").read()
        files += 1
        n = text.count("\n")
        if n > MAX_FILE_LINES:
            long_files += 1
            problems.append(f"{rel}:{n}: {n} lines; split it by concern (at most {MAX_FILE_LINES})")
        for name, first, last in functions(text):
            if last - first + 1 > MAX_FUNCTION_LINES:
                long_functions += 1
                problems.append(f"{rel}:{first}: {name} is {last - first + 1} lines "
                                f"(at most {MAX_FUNCTION_LINES})")
        if not rel.endswith("scope_stack.h"):
            for m in re.finditer(r"thread_local\s+std::(vector|deque|stack|list)\b", strip(text)):
                stacks += 1
                problems.append(f"{rel}:{text[:m.start()].count(chr(10)) + 1}: a scope stack "
                                "rolled by hand; use te::ScopeStack (te/scope_stack.h)")
        if re.search(r"\bat::parallel_(for|reduce)\b", strip(text)) and \
                '#include "te/runtime/parallel.h"' not in text:
            problems.append(f"{rel}:1: splits a loop with at::parallel_for without including "
                            "te/runtime/parallel.h (and te_parallel_sources in CMake)")
    return problems, files, long_files, long_functions, stacks


def self_test():
    """The rule fails on each folder it holds: a file of 501 lines, a function of 81 lines and a
    loop split without te/runtime/parallel.h put in a scratch tree are each named; the same tree
    without them passes."""
    import tempfile
    with tempfile.TemporaryDirectory() as root:
        for top in SOURCE_DIRS:
            os.makedirs(os.path.join(root, top, "src"))
            open(os.path.join(root, top, "src", "ok.cpp"), "w").write("int f() {\n  return 1;\n}\n")
        clean = check(root, SOURCE_DIRS)[0]
        assert not clean, clean
        for top in SOURCE_DIRS:
            open(os.path.join(root, top, "src", "long.cpp"), "w").write("// x\n" * 501)
            body = "".join("  x += 1;\n" for _ in range(79))
            open(os.path.join(root, top, "src", "fn.cpp"), "w").write(
                "int g(int x) {\n" + body + "}\n")
            open(os.path.join(root, top, "src", "par.cpp"), "w").write(
                "void h() {\n  at::parallel_for(0, 1, 1, [](int64_t, int64_t) {});\n}\n")
        problems = check(root, SOURCE_DIRS)[0]
        for top in SOURCE_DIRS:
            for what in (f"{top}/src/long.cpp:501: 501 lines", f"{top}/src/fn.cpp:1: g is 81 lines",
                         f"{top}/src/par.cpp:1: splits a loop with at::parallel_for"):
                assert any(p.startswith(what) for p in problems), (what, problems)
    print(f"self-test: a 501-line file, an 81-line function and a loop split on one thread are "
          f"named in each of "
          f"{', '.join(SOURCE_DIRS)}")
    return 0


def main():
    if "--self-test" in sys.argv:
        return self_test()
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    counts = "--counts" in sys.argv
    problems, files, long_files, long_functions, stacks = check(root, SOURCE_DIRS)
    for p in problems:
        print(p)
    if counts:
        print(f"{files} source files in {', '.join(SOURCE_DIRS)}: {long_files} over "
              f"{MAX_FILE_LINES} lines, {long_functions} functions over {MAX_FUNCTION_LINES} lines, "
              f"{stacks} hand-rolled scope stacks")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
