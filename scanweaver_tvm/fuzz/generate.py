"""Random PyTorch models with recurrences, written out as Python source (one ``Case`` per seed).

A case's source defines ``Model``, ``make_model()``, ``make_inputs(seed)`` and ``EXPECT`` (what
``find_recurrences`` must report), and ends with a ``__main__`` block that re-checks it, so a
saved failure is a standalone reproducer.  Everything is drawn from ``random.Random(seed)``:
the same seed always gives the same source.
"""
import random
from dataclasses import dataclass

from . import blocks

# L skewed towards small (most cases compile in seconds), up to 512
LENGTH_BANDS = ((0.6, 1, 8), (0.25, 9, 32), (0.1, 33, 128), (0.05, 129, 512))
LAYERS = ("linear", "silu", "relu", "gelu", "layer_norm", "matmul")
# TVM 0.27's torch importer gives fp16 matmuls an fp32 result (PyTorch keeps fp16), which
# changes the state dtype of a recurrence downstream in ways the expectation cannot know, and
# it fails to import an fp16 nn.Linear at all (fp16 bias + fp32 product: a TVM crash the
# fuzzer found).  fp16 cases: no Linear; matmul only after the last recurrence.
FP16_NEVER = ("linear",)
FP16_ONLY_LAST = ("matmul",)


@dataclass(frozen=True)
class Case:
    seed: int
    source: str
    expect: dict        # {"found": [[form, L, axis, reverse]], "rejected": [reason...], "unchanged": bool}
    tags: tuple
    dtype: str


def draw_length(rng, max_length):
    r, acc = rng.random(), 0.0
    for p, lo, hi in LENGTH_BANDS:
        acc += p
        if r < acc or hi >= 512:
            lo, hi = min(lo, max_length), min(hi, max_length)
            return rng.randint(lo, hi)
    raise AssertionError("unreachable")


def _layer(src, rng, var, shape, kind):
    """One shape-preserving layer on the last dim of ``var``; returns the new var."""
    n, out = shape[-1], src.name("v")
    if kind == "linear":
        lin = src.name("lin")
        src.init.append(f"self.{lin} = nn.Linear({n}, {n})")
        src.line(f"{out} = self.{lin}({var})")
    elif kind == "layer_norm":
        ln = src.name("ln")
        src.init.append(f"self.{ln} = nn.LayerNorm({n})")
        src.line(f"{out} = self.{ln}({var})")
    elif kind == "matmul":
        w = src.add_param("W", (n, n), "torch.randn({shape}) / " + str(max(n, 1) ** 0.5))
        src.line(f"{out} = {var} @ {w}")
    else:
        fn = {"silu": "F.silu", "relu": "torch.relu", "gelu": "F.gelu"}[kind]
        src.line(f"{out} = {fn}({var})")
    src.tags.add(f"layer:{kind}")
    return out


def _layers(dtype, last):
    if dtype == "float32":
        return LAYERS
    return tuple(k for k in LAYERS if k not in FP16_NEVER + (() if last else FP16_ONLY_LAST))


def _fresh_input(src, rng, length):
    rank = rng.choice([2, 2, 3, 3, 4])
    shape = [rng.choice([1, 2, 3, 4]) for _ in range(rank)]
    shape[rng.randrange(rank)] = length
    return src.add_input("x", shape), tuple(shape)


def generate_case(seed, max_length=512, dtype=None, kind=None):
    """The model for ``seed``.  ``kind`` forces the first block ("affine", "selective" or a
    near-miss name from ``blocks.NEAR_MISSES``); ``dtype`` forces "float32" / "float16"."""
    rng = random.Random(seed)
    dtype = dtype or ("float16" if rng.random() < 0.2 else "float32")
    src = blocks.Source()
    n_blocks = rng.choices([1, 2, 3], weights=[70, 22, 8])[0]
    previous = []
    for i in range(n_blocks):
        what = kind if (i == 0 and kind) else rng.choices(
            ["affine", "near", "selective"], weights=[70, 22, 8])[0]
        if what == "near":
            what = rng.choice(sorted(blocks.NEAR_MISSES))
        if what == "selective" and dtype == "float16":
            what = "affine"                     # the selective matcher is checked in fp32 only
        length = draw_length(rng, max_length)
        if what in blocks.NEAR_MISSES:
            length = max(length, 4)
        if what == "selective":
            var, shape = blocks.selective(src, rng, max(length, 1))
        else:
            earlier = [p for p in previous if len(p[1]) >= 2]   # the state keeps a dim
            if earlier and rng.random() < 0.35:                 # scan something computed earlier
                var, shape = rng.choice(earlier)
                src.tags.add("chained")
            else:
                var, shape = _fresh_input(src, rng, length)
            if rng.random() < 0.4:
                var = _layer(src, rng, var, shape, rng.choice(_layers(dtype, last=False)))
            var, shape = blocks.affine(src, rng, var, shape, what if what in blocks.NEAR_MISSES else None)
        if rng.random() < 0.3:
            var = _layer(src, rng, var, shape, rng.choice(_layers(dtype, last=i == n_blocks - 1)))
        previous.append((var, shape))
        src.outputs.append(var)
    if n_blocks > 1:
        src.tags.add("several")
    # the pass changes the module exactly when it finds something
    expect = {"found": src.found, "rejected": src.rejected, "unchanged": not src.found}
    tags = tuple(sorted(src.tags | {dtype}))
    return Case(seed, render(seed, src, dtype, expect, tags), expect, tags, dtype)


def with_expect(case, expect):
    """The same model with another expectation (the test that a failure is saved uses it)."""
    lines = case.source.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("EXPECT = "))
    lines[i] = f"EXPECT = {expect!r}"
    return Case(case.seed, "\n".join(lines) + "\n", expect, case.tags, case.dtype)


def render(seed, src, dtype, expect, tags):
    args = ", ".join(n for n, _, _ in src.inputs)
    init = "\n".join("        " + s for s in src.init) or "        pass"
    body = "\n".join("        " + s for s in src.body)
    outputs = ", ".join(src.outputs)
    return f'''"""ScanWeaver fuzz case {seed}: a generated model with recurrences.

Run ``python <this file>`` to check it again (exit status 1 when it fails)."""
import torch
import torch.nn.functional as F
from torch import nn

SEED = {seed}
DTYPE = torch.{dtype}
EXPECT = {expect!r}
TAGS = {list(tags)!r}
INPUTS = {[(n, s, k) for n, s, k in src.inputs]!r}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
{init}

    def forward(self, {args}):
{body}
        return ({outputs},)


def make_model():
    torch.manual_seed(SEED)
    return Model().to(DTYPE).eval()


def make_inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    values = []
    for _, shape, kind in INPUTS:
        if kind == "rand":
            v = torch.rand(shape, generator=gen)
        elif kind == "signed":
            v = torch.rand(shape, generator=gen) * 2 - 1
        else:
            v = torch.randn(shape, generator=gen)
        values.append(v.to(DTYPE))
    return tuple(values)


if __name__ == "__main__":
    import sys

    from scanweaver_tvm.fuzz.check import main_for_file

    sys.exit(main_for_file(__file__))
'''
