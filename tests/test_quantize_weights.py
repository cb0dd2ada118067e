"""Weight-only formats (``weights="int8"``, ``"int4_asym_g32"``, ...): each constant dense weight
quantized once at compile time, kept packed through the CPU pipeline (widened or unpacked in
registers), the result equal to the dequantized layer's and close to the float model's."""
import re
import warnings

import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir.expr import GenericConst

import scanweaver_tvm as sw
from harness import quantized_copy, teacher_forced
from relax_pass.quantize_weights import QuantizeWeights, quantize_weights
from scanweaver_core.targets import host_target
from scanweaver_core.weight_formats import weight_format
from scanweaver_tvm.causal_lm import torch_kernels
from test_causal_lm import _family
from test_causal_lm_hybrids import FAMILIES as HYBRIDS
from tir_schedules import dense_cpu, dequantize_gemv_cpu
from tir_schedules.cpu_rule import has_feature


class Layer(torch.nn.Module):
    def __init__(self, k=64, n=96):
        super().__init__()
        self.lin = torch.nn.Linear(k, n)

    def forward(self, x):
        return torch.nn.functional.silu(self.lin(x))


def _constants(mod):
    found = []
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            tvm_ffi.structural_walk(func, lambda x: found.append(x) if isinstance(x, GenericConst) else None)
    return found


@pytest.mark.parametrize("spec", ["int8", "int8_asym", "int4", "int4_g32", "int4_asym_g64"])
def test_each_format_rounds_to_the_nearest_of_its_levels(spec):
    """Each weight is within half a step of its group's scale from its value (symmetric int4:
    the group's largest magnitude is level -8, so a weight of the other sign past 7.5 steps is
    clipped to 7, at most one step off); symmetric formats keep 0 exactly; the values fill the
    format's range (symmetric int8: +-127; int4: all 16 levels); a zero column stays zero."""
    fmt = weight_format(spec)
    w = np.random.default_rng(0).standard_normal((200, 40)).astype("float32")
    w[:, 3] = 0.0
    q = fmt.quantize(w)
    groups = -(-200 // (fmt.group or 200))
    assert q.scale.shape == (groups, 40) and q.values.shape == (200, 40)
    step = np.abs(q.scale.astype(np.float64))[np.arange(200) // q.group]
    error = np.abs(q.dequantize() - w)
    clipped = (q.values == 15) & (np.abs(w) > 7.5 * step) if fmt.symmetric and fmt.bits == 4 else False
    assert (error <= step / 2 + 1e-6).all(where=~clipped) and (error <= step + 1e-6).all()
    assert (q.dequantize()[:, 3] == 0).all()
    levels = 2 ** fmt.bits
    assert int(q.values.max()) - int(q.values.min()) == levels - 1 - (fmt.symmetric and fmt.bits == 8)
    if fmt.symmetric:
        assert (q.dequantize()[w == 0] == 0).all()


def test_int4_panels_hold_two_columns_a_byte():
    """``packed``: panels of 32 columns streamed over k, column c in the low nibble of byte c
    and column c + 16 in its high one; a ragged last panel padded with zeros."""
    q = weight_format("int4_g32").quantize(np.random.default_rng(1).standard_normal((64, 40)))
    packed = q.packed()
    assert packed.shape == (2, 64, 16) and packed.dtype == np.uint8
    unpacked = np.concatenate([packed & 15, packed >> 4], axis=-1)          # (panel, k, 32)
    columns = unpacked.transpose(1, 0, 2).reshape(64, 64)
    assert (columns[:, :40] == q.values).all() and (columns[:, 40:] == 0).all()


@pytest.mark.parametrize("spec,dtype,rows,depth", [
    ("int8", torch.float32, (2, 9), 200), ("int8", torch.bfloat16, (2, 9), 200),
    ("int8_asym", torch.float32, (2, 9), 200), ("int4", torch.float32, (2, 9), 200),
    ("int4_asym_g32", torch.bfloat16, (2, 9), 200),
    ("int4", torch.float32, (1, 1), 256), ("int8_asym", torch.bfloat16, (1, 3), 200),   # decode: by groups
    ("int4_asym_g32", torch.float32, (1, 1), 200), ("int4_g64", torch.float32, (1, 1), 48)])   # (a short group)
def test_quantized_layer_equals_its_dequantized_weight(spec, dtype, rows, depth):
    """The Linear's weight becomes the format's (the report says so, with its bytes); compiled,
    the layer equals float64 of ``x @ dequantize(W) + b`` (the quantized layer computed
    exactly), within the format's error of the float layer.  Widths off the 32-column panels,
    K off the groups, bf16 models, and a few rows (decode's kernel, summed by groups) too."""
    torch.manual_seed(0)
    model = Layer(depth, 100).eval().to(dtype)
    x = torch.randn(*rows, depth).to(dtype)
    mod = sw.from_torch(model, [x])
    fmt = weight_format(spec)
    quantized, report = quantize_weights(mod, spec)
    assert report.weights == [(depth, 100)] and report.formats == [fmt.name]
    assert report.bytes_before == depth * 100 * (4 if dtype == torch.float32 else 2)
    groups = -(-depth // (fmt.group or depth))     # (int8: its scales; the others: panels of 32 columns)
    packed = depth * 100 + 4 * 100 if spec == "int8" else depth * 128 * fmt.bits // 8 + 2 * 4 * groups * 128
    assert report.bytes_after == packed
    vm = relax.VirtualMachine(sw.compile(mod, "llvm", weights=spec), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x.float().numpy().astype(ml_dtypes.bfloat16 if dtype == torch.bfloat16
                                                                 else np.float32)))
    got = np.asarray((out[0] if not hasattr(out, "numpy") else out).numpy(), dtype=np.float64)
    w = fmt.quantize(model.lin.weight.detach().double().numpy().T).dequantize()
    y = x.double().numpy() @ w + model.lin.bias.detach().double().numpy()
    exact, plain = y / (1 + np.exp(-y)), model(x).double().detach().numpy()
    rounding = 1e-5 if dtype == torch.float32 else 2 ** -7
    assert np.abs(got - exact).max() <= rounding * np.abs(exact).max()
    assert np.abs(got - plain).max() <= (3e-2 if fmt.bits == 8 else 0.2) * np.abs(plain).max()


@pytest.mark.parametrize("spec", ["int4", "int4_asym_g32"])
def test_a_4bit_weight_shorter_than_a_group_takes_the_8bit_backup(spec):
    """A weight of fewer rows than the smallest group (Mamba's ``dt_proj``: K = 16) is stored
    ``int8_asym``, NNCF's backup there, and computes that format's weight; a longer one keeps
    the 4-bit format."""
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Linear(64, 48)).eval()
    x = torch.randn(1, 5, 16)
    _, report = quantize_weights(sw.from_torch(model, [x]), spec)
    assert report.weights == [(16, 64), (64, 48)] and report.formats == ["int8_asym", weight_format(spec).name]
    vm = relax.VirtualMachine(sw.compile(sw.from_torch(model, [x]), "llvm", weights=spec), tvm.cpu())
    got = np.asarray(vm["main"](tvm.runtime.tensor(x.numpy()))[0].numpy(), dtype=np.float64)
    w0 = weight_format("int8_asym").quantize(model[0].weight.detach().double().numpy().T).dequantize()
    w1 = weight_format(spec).quantize(model[1].weight.detach().double().numpy().T).dequantize()
    h = x.double().numpy() @ w0 + model[0].bias.detach().double().numpy()
    y = h @ w1 + model[1].bias.detach().double().numpy()
    assert np.abs(got - y).max() <= 1e-5 * np.abs(y).max()


@pytest.mark.parametrize("spec,packed,rows,rule,depth,cols", [("int8", "int8", 5, "DenseCPU", 128, 256),
                                                              ("int4_asym_g32", "uint8", 3, "DenseCPU", 200, 256),
                                                              ("int4_asym_g32", "uint8", 12, "DenseCPU", 128, 256),
                                                              ("int4", "uint8", None, "DenseCPU", 128, 20),
                                                              ("int4", "uint8", 1, "DequantizeGemvCPU", 128, 256)])
def test_lowered_module_keeps_every_weight_packed(spec, packed, rows, rule, depth, cols):
    """Through the CPU pipeline (legalized, fused, scheduled, weights packed): the dense kernel
    reads its packed weight (int8 panels; int4: two a byte, widened in registers: in the
    register tile of a GEMM with one row tile, once a panel under the parallel panel loop where
    several row tiles reuse it (also over a symbolic length, one panel wide), in each group's
    accumulators of a decode step's GEMV; K off the groups keeps the GEMM) and no float copy of
    the weight is left anywhere."""
    torch.manual_seed(1)
    model, x = Layer(depth, cols).eval(), torch.randn(1, rows or 40, depth)
    target = host_target()
    mod = (sw.from_torch(model, [x]) if rows else
           sw.from_torch(model, [x], dynamic_shapes=({1: torch.export.Dim("L", min=2, max=4096)},)))
    with target:
        lowered = tvm.transform.Sequential([sw.passes(target), QuantizeWeights(spec),
                                            *dense_cpu.tunable_passes(target), *dense_cpu.schedule_passes()])(mod)
    called = []
    relax.analysis.post_order_visit(lowered["main"], lambda e: called.append(e.name_hint)
                                    if isinstance(e, tvm.ir.GlobalVar) else None)
    dense = [lowered[name] for name in called if (lowered[name].attrs or {}).get("scanweaver.rule") == rule]
    assert len(dense) == 1
    assert [str(p.ty.dtype) for p in dense[0].params if len(p.ty.shape) == 3] == [packed]
    script = dense[0].script()
    per_panel = rule == "DenseCPU" and spec != "int8" and (rows is None or rows > dense_cpu.register_tile(target).rows)
    if per_panel:                                                    # (under the panel loop, before the tiles)
        assert script.index("T.parallel(") < script.index('sblock("dequantize")') < script.index('sblock("matmul')
    else:                                                            # (inlined into the register tile)
        assert 'sblock("dequantize")' not in script
    if rule == "DequantizeGemvCPU":                                  # (a group's sums: in registers)
        assert 'partial_local = T.sblock_alloc_buffer' in script and 'scope="local"' in script
    floats = [c for c in _constants(lowered) if "float" in str(c.value.dtype) and np.prod(c.value.shape) >= depth * cols]
    assert not floats, [tuple(c.value.shape) for c in floats]


@pytest.mark.parametrize("mcpu,wide", [("znver3", False), ("znver4", True)])
def test_decode_gemv_by_target(mcpu, wide):
    """A decode step's int4 layer, compiled for AVX2 (znver3: 2 panels a tile, ymm registers,
    no zmm) and AVX-512 (znver4: 4 panels, zmm): the nibbles widened and converted in vector
    registers (read in the assembly), and where the host runs the target, the result equal to
    float64 of ``x @ dequantize(W) + b``."""
    torch.manual_seed(2)
    model, x = Layer(256, 384).eval(), torch.randn(1, 1, 256)
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "mtriple": "x86_64-linux-gnu"})
    assert dequantize_gemv_cpu._panels_per_tile(target, 12) == (4 if wide else 2)   # pylint: disable=protected-access
    ex = sw.compile(sw.from_torch(model, [x]), target, weights="int4")
    asm = ex.mod.imports[0].inspect_source("asm")
    assert re.search(r"vcvtdq2ps\s+%zmm", asm) if wide else (re.search(r"vcvtdq2ps\s+%ymm", asm) and "zmm" not in asm)
    if wide and not has_feature(host_target(), "avx512f"):
        return                                             # (compiled and read; this CPU has no AVX-512)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    got = np.asarray((out[0] if not hasattr(out, "numpy") else out).numpy(), dtype=np.float64)
    w = weight_format("int4").quantize(model.lin.weight.detach().double().numpy().T).dequantize()
    y = x.double().numpy() @ w + model.lin.bias.detach().double().numpy()
    exact = y / (1 + np.exp(-y))
    assert np.abs(got - exact).max() <= 1e-5 * np.abs(exact).max()


def _bf16(a):
    """float32 ``a`` rounded to bf16 (to nearest, ties to even), as float32."""
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


@pytest.mark.parametrize("mcpu,dot", [("znver3", False), ("znver4", True)])
@pytest.mark.parametrize("spec", ["int8", "int4"])
def test_bf16_prefill_activations_where_asked_and_the_target_has_them(spec, mcpu, dot):
    """``activations="bfloat16"``: on AVX512-BF16 (znver4) a prefill's layer rounds its
    activations and its dequantized weight (int8 too) to bf16 and multiplies with
    ``vdpbf16ps`` (read in the assembly; the report counts the layer); where the host runs it,
    equal to float64 of ``bf16(x) @ bf16(dequantize(W))`` (bf16 rounds float32 activations by
    ~4e-3, so 1e-4 tells them apart).  On AVX2 (znver3) the layer keeps
    float32 activations, equal to ``x @ dequantize(W)``; a decode step's rows keep them on both."""
    torch.manual_seed(3)
    model, x = Layer(256, 384).eval(), torch.randn(1, 67, 256)
    fmt = weight_format(spec, activations="bfloat16")
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "mtriple": "x86_64-linux-gnu"})
    mod = sw.from_torch(model, [x])
    assert quantize_weights(mod, fmt, target)[1].bf16_activations == int(dot)
    assert quantize_weights(sw.from_torch(model, [x[:, :1]]), fmt, target)[1].bf16_activations == 0
    ex = sw.compile(mod, target, weights=fmt)
    assert ("vdpbf16ps" in ex.mod.imports[0].inspect_source("asm")) == dot
    if dot and not has_feature(host_target(), "avx512bf16"):
        return                                             # (compiled and read; this CPU has no AVX512-BF16)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    got = np.asarray((out[0] if not hasattr(out, "numpy") else out).numpy(), dtype=np.float64)
    quantized = fmt.quantize(model.lin.weight.detach().double().numpy().T).unsigned()
    g = np.arange(256) // quantized.group
    w = quantized.values.astype(np.float32) * quantized.scale[g] + quantized.low[g]    # (in float32, as the kernel)
    xs = x.numpy()[0]
    y = ((_bf16(xs).astype(np.float64) @ _bf16(w).astype(np.float64)) if dot
         else xs.astype(np.float64) @ quantized.dequantize()) + model.lin.bias.detach().double().numpy()
    exact = y / (1 + np.exp(-y))       # (bf16: a weight's float32 rounding, e.g. FMA or not, can
    assert np.abs(got - exact).max() <= (1e-4 if dot else 1e-5) * np.abs(exact).max()   # move it a bf16 step)


def test_an_unknown_format_is_a_clear_error():
    model = transformers.MambaForCausalLM(transformers.MambaConfig(
        vocab_size=64, hidden_size=32, state_size=8, num_hidden_layers=1, expand=2))
    with pytest.raises(ValueError, match=r"weights='int3': the formats are int8 and int8_asym"):
        sw.compile_causal_lm(model, weights="int3")


def _mamba():
    return transformers.MambaForCausalLM(transformers.MambaConfig(
        vocab_size=64, hidden_size=64, state_size=8, num_hidden_layers=2, expand=2))


FAMILIES = {"mamba": _mamba, "mamba2": lambda: _family("mamba2")[0], "qwen3_next": HYBRIDS["qwen3_next"][0]}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_int8_model_generates_and_agrees_with_float32(family):
    """A tiny model of each kind (selective, Mamba-2's matrix scan, Gated DeltaNet with gated
    attention and experts) compiled with int8 weights generates; fed transformers' float32
    greedy tokens (teacher forcing), its logits stay within 5% of float32's, and its next-token
    choice is float32's at 90% of the positions or more, every other choice a near tie (a
    token whose float32 logit is within that position's int8 error of the best: random tiny
    models have many; each is reported)."""
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    lm = sw.compile_causal_lm(model, weights="int8")
    agree, ties, total, worst = 0, [], 0, 0.0
    for seed in range(3):
        ids = torch.randint(3, 60, (1, 6 + seed), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad(), torch_kernels():
            tokens = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6)
            want = model(tokens).logits[0].double().numpy()         # (every position's, float32)
        logits, states = lm.prefill(ids.numpy(), max_length=tokens.shape[1] + 1)
        for position in range(ids.shape[1] - 1, tokens.shape[1] - 1):
            got, best = logits.numpy()[0].astype(np.float64), want[position]
            error = np.abs(got - best).max()
            worst = max(worst, error / np.abs(best).max())
            total += 1
            if got.argmax() == int(tokens[0, position + 1]):
                agree += 1
            else:
                behind = best.max() - best[got.argmax()]
                assert behind <= error, (family, position, behind, error)
                ties.append((seed, position, round(float(behind), 5), round(float(error), 5)))
            logits, states = lm.decode(tokens[:, position + 1].numpy(), states)
    assert worst <= 0.05, (family, worst)
    assert agree >= 0.9 * total, (family, agree, total, ties)
    if ties:
        warnings.warn(f"{family} int8: {len(ties)} of {total} next tokens differ from float32's, each a near tie "
                      f"(seed, position, behind the best, int8 error there): {ties}")
    assert lm.generate(ids, max_new_tokens=3).shape == (1, ids.shape[1] + 3)


@pytest.mark.parametrize("family,spec", [("mamba", "int4"), ("mamba2", "int4_asym_g32"), ("qwen3_next", "int4_g64")])
def test_int4_model_computes_its_quantized_weights(family, spec):
    """int4 in groups, symmetric or not, through the public API: the compiled model is the
    float model with its dense weights replaced by their int4 values (the logits layer's at
    int8): teacher-forced on that model's greedy tokens, every position's logits within 1e-4
    of its (relative to the largest), the generated tokens its.  (How far int4 moves a real
    model from float32 is the bench's quality table: on a random tiny model it is noise.)"""
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    reference = quantized_copy(model, weight_format(spec))
    lm = sw.compile_causal_lm(model, weights=spec)
    ids = torch.randint(3, 60, (1, 7), generator=torch.Generator().manual_seed(0))
    tokens, steps = teacher_forced(lm, reference, ids, 5)
    for position, got, want in steps:
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), (family, position)
    assert torch.equal(lm.generate(ids, max_new_tokens=5), tokens)


@pytest.mark.parametrize("family,spec", [("mamba", "int4"), ("qwen3_next", "int8")])
def test_bf16_prefill_model_follows_its_quantized_weights(family, spec):
    """``activations="bfloat16"`` through ``compile_causal_lm`` (a prefill of any length: the
    rows symbolic): teacher-forced on the quantized model's greedy tokens, the logits within
    1% of that model's where this CPU has AVX512-BF16 (the prefill's layers round their
    activations to bf16; decode keeps float32), within 1e-4 where it has not (the format's
    request is not met there, and nothing else changes); the greedy tokens its."""
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    fmt = weight_format(spec, activations="bfloat16")
    reference = quantized_copy(model, fmt)
    lm = sw.compile_causal_lm(model, weights=fmt)
    tolerance = 1e-2 if has_feature(host_target(), "avx512bf16") else 1e-4
    ids = torch.randint(3, 60, (1, 37), generator=torch.Generator().manual_seed(0))
    tokens, steps = teacher_forced(lm, reference, ids, 4)
    for position, got, want in steps:
        assert np.abs(got - want).max() <= tolerance * np.abs(want).max(), (family, position)
        assert got.argmax() == int(tokens[0, position + 1])
