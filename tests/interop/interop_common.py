"""What the tests/interop/ checks share: te's JSON tensors rebuilt in float64, the relative error
they are held to, and the loop that checks every case and reports."""

import json

import torch

TOL = 1e-5


def tensor(j, dtype=torch.float64):
    """A tensor te wrote with cases.h's as_json: {"shape": [...], "values": [...]}."""
    return torch.tensor(j["values"], dtype=dtype).reshape(j["shape"])


def rel_err(mine, want):
    """max |mine - want| / max(1, max |want|)."""
    return (mine - want).abs().max().item() / max(1.0, want.abs().max().item())


def run_cases(path, check, reference):
    """check(case) -> (name, {what: rel_err}); prints each case and a summary naming
    `reference`; returns the exit status (1 when any error is above TOL)."""
    cases = json.load(open(path))
    failures = 0
    for c in cases:
        name, errors = check(c)
        bad = {k: e for k, e in errors.items() if not e <= TOL}
        failures += bool(bad)
        print("%s %s: %s" % ("FAIL" if bad else "ok  ", name,
                             ", ".join("%s %.2g" % kv for kv in errors.items())))
    print("%d of %d cases differ from %s (tolerance %g)" % (failures, len(cases), reference, TOL))
    return 1 if failures else 0
