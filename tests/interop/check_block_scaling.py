"""Holds te::fp8's block-scaled casts (the cases te_interop_block_scaling wrote) to Transformer
Engine's Python references at NVIDIA/TransformerEngine d0067d0da6cb01811b8072a7d304f0e00344ce2b,
their rules written out here with PyTorch (TE itself needs a GPU to import), every FP8 cast
PyTorch's float8_e4m3fn / float8_e5m2:
- Float8BlockScaling: tests/pytorch/references/blockwise_quantizer_reference.py
  (_quantize_vectorwise_reference, _quantize_square_block_tiling: zero padding, a tile's amax,
  x * scale clamped and cast) with quantize_scale_calc.py's scale_from_amax_tensor (epsilon
  floor, fp8_max / amax, FLT_MAX for an infinite quotient, frexp power of two, 1 for amax 0);
- MXFP8: tests/pytorch/test_mxfp8_2d_quantize.py (_float_to_e8m0: amax / 448 rounded up to a
  power of two by its bits; x / 2^(e - 127) cast), per 1x32 block along the rows;
- NVFP4: transformer_engine/pytorch/custom_recipes/reference_nvfp4.py (NVFP4QuantizerRef.
  _quantize_blockwise_reference, cast_to_fp4x2, _build_hadamard_matrix, get_wgrad_sign_vector,
  _apply_rht); values as dequantize_nvfp4.cuh's code * (scale * amax * (1 / 2688)).
Codes and scales must be identical, transforms within 1e-6.

  python check_block_scaling.py CASES.json
"""

import json
import sys

import torch
from interop_common import tensor

F32_MAX = torch.finfo(torch.float32).max


def cast_to_fp4x2(x):
    """reference_nvfp4.py cast_to_fp4x2: round to nearest even on E2M1's grid, two codes a byte
    (element 2k in the low nibble). -0.0 takes the sign code 8 as the hardware conversion does
    (the reference's table sends it to 0; its value is the same)."""
    a = x.abs()
    bounds = [(0.25, True), (0.75, False), (1.25, True), (1.75, False), (2.5, True), (3.5, False),
              (5.0, True)]
    code = torch.zeros_like(x, dtype=torch.uint8)
    for i, (b, tie_down) in enumerate(bounds):
        code = torch.where((a > b) if tie_down else (a >= b), torch.full_like(code, i + 1), code)
    r = torch.where((x < 0) | ((x == 0) & torch.signbit(x)), code + 8, code)
    return (r[:, ::2] + r[:, 1::2] * 16).to(torch.uint8)


def quantize(x, tiles, amax=None):
    """_quantize_blockwise_reference (non-4over6, non-pow2) for x [m, n], 1x16 or 16x16."""
    m, n = x.shape
    pad_m = (-m) % 16 if tiles else 0
    xp = torch.nn.functional.pad(x, (0, 0, 0, pad_m))  # zero rows change no tile's amax
    if tiles:
        blocks = xp.unfold(0, 16, 16).unfold(1, 16, 16)  # [m/16, n/16, 16, 16]
        vec_max = blocks.abs().amax(dim=(-1, -2)).repeat_interleave(16, 0)[:m].unsqueeze(-1)
    else:
        vec_max = x.view(m, n // 16, 16).abs().amax(-1, keepdim=True)
    global_amax = torch.tensor(amax if amax is not None else x.abs().max().item(),
                               dtype=torch.float32)
    s_enc = torch.div(torch.tensor(448.0 * 6.0), global_amax)
    s_enc = torch.minimum(s_enc, torch.tensor(F32_MAX))
    if s_enc == 0:
        s_enc = torch.tensor(1.0)
    s_dec = torch.div(1.0, s_enc)
    decode = vec_max * (s_enc * torch.reciprocal(torch.tensor(6.0)))
    decode = torch.minimum(decode, torch.tensor(F32_MAX)).clamp(-448.0, 448.0)
    decode = decode.to(torch.float8_e4m3fn)
    encode = torch.minimum(torch.div(1.0, decode.to(torch.float32) * s_dec),
                           torch.tensor(F32_MAX))
    scaled = (x.view(m, n // 16, 16) * encode).clamp(-6.0, 6.0).reshape(m, n)
    codes = cast_to_fp4x2(scaled)
    scales = decode.squeeze(-1).view(torch.uint8)
    if tiles:
        scales = scales[::16]
    return codes, scales, global_amax.item()


E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def dequantize(codes, scales, amax, tiles):
    """dequantize_nvfp4.cuh: code * (float(scale) * amax * (1 / (6 * 448))) in fp32."""
    m = codes.shape[0]
    lo, hi = E2M1[(codes & 0xF).long()], E2M1[(codes >> 4).long()]
    v = torch.stack([lo, hi], -1).reshape(m, -1)
    s = scales.view(torch.float8_e4m3fn).to(torch.float32)
    if tiles:
        s = s.repeat_interleave(16, 0)[:m]
    final = s * torch.tensor(amax, dtype=torch.float32) * torch.tensor(1.0 / 2688.0,
                                                                       dtype=torch.float32)
    return v * final.repeat_interleave(16, 1)


def hadamard(x):
    """_apply_rht with _build_hadamard_matrix(16, with_random_sign_mask=True): x @ (D H) / 4,
    x zero-padded to a multiple of 16 columns."""
    h = torch.ones(1, 1)
    while h.shape[0] < 16:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    signs = torch.tensor([1.0, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1])
    m = torch.diag(signs) @ h * (1.0 / 16 ** 0.5)
    x = torch.nn.functional.pad(x, (0, (-x.shape[1]) % 16)).to(torch.float64)
    return (x.reshape(-1, 16) @ m.to(torch.float64)).reshape(x.shape)


def scale_from_amax(amax, fp8_max, pow_2, eps):
    """quantize_scale_calc.py scale_from_amax_tensor for fp32 input: (scale, scale_inv)."""
    amax = torch.maximum(amax, torch.tensor(eps, dtype=torch.float32))
    scale = torch.div(torch.tensor(fp8_max, dtype=torch.float32), amax)
    scale = torch.where(scale == torch.inf, torch.tensor(F32_MAX), scale)
    if pow_2:
        _, e = torch.frexp(scale)
        scale = torch.ldexp(torch.ones_like(scale), e - 1)
        scale = torch.where(amax == torch.inf, torch.zeros_like(scale), scale)
    scale = torch.where(amax == 0, torch.ones_like(scale), scale)
    return scale, torch.reciprocal(scale)


def block_quantize(x, tiles, dtype, pow_2, eps):
    """blockwise_quantizer_reference.py for x [m, n]: 1x128 blocks or 128x128 tiles, zero padded."""
    m, n = x.shape
    xp = torch.nn.functional.pad(x, (0, (-n) % 128, 0, ((-m) % 128) if tiles else 0))
    fp8_max = torch.finfo(dtype).max
    if tiles:
        grid = xp.reshape(xp.shape[0] // 128, 128, xp.shape[1] // 128, 128)
        amax = grid.abs().amax(dim=(1, 3))
        scale, scale_inv = scale_from_amax(amax, fp8_max, pow_2, eps)
        q = grid * scale.reshape(amax.shape[0], 1, amax.shape[1], 1)
    else:
        grid = xp.reshape(m, xp.shape[1] // 128, 128)
        amax = grid.abs().amax(dim=-1)
        scale, scale_inv = scale_from_amax(amax, fp8_max, pow_2, eps)
        q = grid * scale.unsqueeze(-1)
    q = q.clamp(-fp8_max, fp8_max).to(dtype).reshape(xp.shape)[:m, :n]
    return q.view(torch.uint8), scale_inv


def mx_quantize(x, dtype):
    """_float_to_e8m0 and the cast of test_mxfp8_2d_quantize.py, per 1x32 block along the rows."""
    m, n = x.shape
    grid = torch.nn.functional.pad(x, (0, (-n) % 32)).reshape(m, -1, 32)
    amax = grid.abs().amax(-1)
    val = (amax / torch.finfo(dtype).max).contiguous()
    bits = val.view(torch.int32)
    exponent, mantissa = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    up = (mantissa > 0) & (exponent != 254) & ~((exponent == 0) & (mantissa <= 0x400000))
    e = torch.where(val == 0, torch.zeros_like(exponent), exponent + up.to(torch.int32))
    scale_inv = torch.pow(2.0, e.to(torch.float32) - 127)
    q = (grid / scale_inv.unsqueeze(-1)).to(dtype).reshape(m, -1)[:, :n]
    return q.view(torch.uint8), e.to(torch.uint8)


def check_fp8_case(c):
    """Float8BlockScaling and MXFP8 cases: the problems found (none: identical)."""
    x = tensor(c["x"], torch.float32)
    dtype = torch.float8_e4m3fn if c["e4m3"] else torch.float8_e5m2
    codes = tensor(c["codes"], torch.int64).to(torch.uint8)
    if c["recipe"] == "block":
        want_codes, want_scales = block_quantize(x, c["tiles"], dtype, c["power_2"], c["epsilon"])
        scales = tensor(c["scale_inv"], torch.float32)
    else:
        want_codes, want_scales = mx_quantize(x, dtype)
        scales = tensor(c["scales"], torch.int64).to(torch.uint8)
    problems = []
    if not torch.equal(codes, want_codes):
        problems.append("%d codes differ" % (codes != want_codes).sum().item())
    if not torch.equal(scales, want_scales):
        problems.append("%d scales differ" % (scales != want_scales).sum().item())
    return problems


def main(path):
    cases = json.load(open(path))
    failures, checked = 0, 0
    for c in cases:
        if c["recipe"] != "nvfp4":
            problems = check_fp8_case(c)
            checked += 1
            failures += bool(problems)
            print("%s %s %s: %s" % ("FAIL" if problems else "ok  ", c["recipe"], c["name"],
                                    "; ".join(problems) or "codes and scales identical"))
            continue
        if c["name"] == "hadamard":
            for t in c["transforms"]:
                x, y = tensor(t["x"], torch.float32), tensor(t["y"])
                err = (hadamard(x) - y).abs().max().item()
                checked += 1
                if not err <= 1e-6:
                    failures += 1
                    print("MISMATCH hadamard %s: max abs error %.3g" % (list(x.shape), err))
            continue
        x = tensor(c["x"], torch.float32)
        codes, scales, amax = quantize(x, c["tiles"], c.get("given_amax"))
        mine_codes = tensor(c["codes"], torch.int64).to(torch.uint8)
        mine_scales = tensor(c["scales"], torch.int64).to(torch.uint8)
        values = dequantize(mine_codes, mine_scales, c["amax"], c["tiles"])
        problems = []
        if not torch.equal(mine_codes, codes):
            problems.append("%d codes differ" % (mine_codes != codes).sum().item())
        if not torch.equal(mine_scales, scales):
            problems.append("%d scales differ" % (mine_scales != scales).sum().item())
        if c["amax"] != amax:
            problems.append("amax %r, not %r" % (c["amax"], amax))
        if not torch.equal(tensor(c["values"], torch.float32), values):
            problems.append("values differ from dequantize_nvfp4.cuh's")
        checked += 1
        failures += bool(problems)
        print("%s nvfp4 %s: %s" % ("FAIL" if problems else "ok  ", c["name"],
                                   "; ".join(problems) or "codes, scales, amax and values identical"))
    print("check_block_scaling: %d cases against TE's reference rules (torch %s): %d mismatches"
          % (checked, torch.__version__, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
