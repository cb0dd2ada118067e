"""Shared test plumbing: random operands, NaN-poisoned outputs, float64 comparison."""
import ml_dtypes
import numpy as np
import tvm

from scanweaver_tvm import reference as ref

NP_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# Output rounding of each dtype, times a margin for fp32 accumulation order differences.
TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def plain_operands(spec, rng, length=None):
    """Random ``a`` (|a| <= 1: bounded recurrence), ``b`` and ``h0`` for a plain spec."""
    shape = tuple(length if n is None else n for n in spec.shape)
    a_shape = tuple(length if n is None else n for n in spec.a_shape)
    dt = NP_DTYPES[spec.dtype]
    a = rng.uniform(-1.0, 1.0, a_shape).astype(dt)
    b = rng.standard_normal(shape).astype(dt)
    h0 = rng.standard_normal(spec.state_shape).astype(dt) if spec.has_h0 else None
    return a, b, h0


def plain_expected(spec, a, b, h0):
    """float64 reference states and last state, computed on the (rounded) inputs."""
    states = ref.affine_scan(a.astype(np.float64), b.astype(np.float64),
                             None if h0 is None else h0.astype(np.float64), spec.axis, spec.reverse)
    return {"states": states, "last": ref.last_state(states, spec.axis, spec.reverse)}


def run(kernel, inputs, output_shapes, dtype):
    """Call a compiled kernel with outputs pre-filled with NaN; return outputs as float64."""
    dev = tvm.cpu()
    dt = NP_DTYPES[dtype]
    outs = [np.full(s, np.nan, dtype=dt) for s in output_shapes]
    tensors = [tvm.runtime.tensor(np.ascontiguousarray(x), dev) for x in inputs if x is not None]
    out_tensors = [tvm.runtime.tensor(o, dev) for o in outs]
    kernel(*tensors, *out_tensors)
    return [t.numpy().astype(np.float64) for t in out_tensors]


def assert_close(got, want, dtype, what):
    """Max error relative to the reference's magnitude; NaN (an unwritten element) fails."""
    assert not np.isnan(got).any(), f"{what}: {int(np.isnan(got).sum())} elements never written"
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got - want).max()) / scale
    assert err <= TOL[dtype], f"{what}: relative error {err:.3g} > {TOL[dtype]}"


def check_plain(kernel, spec, rng, length=None):
    """Run a plain-scan kernel on fresh random operands and compare every output."""
    a, b, h0 = plain_operands(spec, rng, length)
    want = plain_expected(spec, a, b, h0)
    shapes = [want[k].shape for k in spec.outputs]
    got = run(kernel, [a, b, h0], shapes, spec.dtype)
    for name, g in zip(spec.outputs, got):
        assert_close(g, want[name], spec.dtype, f"{name} (shape {b.shape}, spec {spec})")


def run_model(mod, args, target="llvm", **kwargs):
    """Compile a Relax module with ScanWeaver (``sw.compile``) and run ``main`` on torch tensors."""
    import scanweaver_tvm as sw
    from tvm import relax

    vm = relax.VirtualMachine(sw.compile(mod, target, **kwargs), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a.numpy()) for a in args])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def torch_outputs(model, args):
    """What the PyTorch model returns, as a list of numpy arrays."""
    import torch

    with torch.no_grad():
        out = model(*args)
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


def assert_outputs_match(got, want, rtol=1e-4):
    """Same number and shapes of outputs, max error relative to the magnitude within ``rtol``."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        err = np.abs(g - w).max() / max(1.0, np.abs(w).max())
        assert err <= rtol, f"relative error {err:.2e}"


def compile_unfused_within_budget(mod, deadline_s=180):
    """``mod`` (where the pass fuses nothing) compiled by ``tvm.compile`` and by ``sw.compile``,
    each in a thread given ``deadline_s`` (a compile that does not return is a failure, not a
    hung suite), the latter within ``compile_budget`` of the former; returns sw's Executable.
    Both are timed in this process's CPU seconds, not wall seconds: under ``pytest -n 2`` the
    other worker takes a core from one compile and not the other (wall time once read 6.6 s
    against 1.8 s for a compile that takes 4.3 s against 1.9 s alone)."""
    import threading
    import time

    import scanweaver_tvm as sw
    import tir_schedules
    from scanweaver_tvm.fuzz.check import compile_budget

    assert not [r for r in sw.find_recurrences(mod) if not r.rejected], "a recurrence was fused"

    def timed(what, fn):
        box = {}

        def work():
            start = time.process_time()
            box["out"] = fn()
            box["s"] = time.process_time() - start

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        thread.join(deadline_s)
        assert "s" in box, f"{what} did not finish in {deadline_s} s"
        return box["out"], box["s"]

    _, base_s = timed("tvm.compile", lambda: tvm.compile(mod, target=tir_schedules.host_target()))
    ex, ours_s = timed("sw.compile", lambda: sw.compile(mod, "llvm"))
    assert ours_s <= compile_budget(base_s), f"sw.compile {ours_s:.1f} s, tvm.compile {base_s:.1f} s"
    return ex


def quantized_copy(model, fmt):
    """``model`` with each dense weight ``quantize_weights`` takes replaced by its format's
    dequantized value (``QuantizedWeight.dequantize``): the model a quantized build computes."""
    import torch

    copy = type(model)(model.config).eval()
    copy.load_state_dict(model.state_dict())
    for module in copy.modules():
        if isinstance(module, torch.nn.Linear) and min(module.weight.shape) >= 16:
            layer = fmt.head_format() if module.weight.shape == model.get_input_embeddings().weight.shape else fmt
            if layer is None:
                continue
            w = module.weight.detach().double().numpy().T
            module.weight = torch.nn.Parameter(             # (a new one: a tied embedding stays float)
                torch.tensor(layer.for_depth(w.shape[0]).quantize(w).dequantize().T, dtype=module.weight.dtype))
    return copy


def teacher_forced(lm, reference, ids, new):
    """``reference``'s greedy ``new`` tokens after ``ids``, and at each position from the
    prompt's last one ``(position, ours, reference's)`` logits (float64): ours from
    ``lm.prefill`` of ``ids``, then ``lm.decode`` fed the reference's tokens."""
    import torch
    from scanweaver_tvm.causal_lm import torch_kernels

    with torch.no_grad(), torch_kernels():
        tokens = reference.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new)
        want = reference(tokens).logits[0].double().numpy()
    logits, states = lm.prefill(ids.numpy(), max_length=tokens.shape[1] + 1)
    steps = []
    for position in range(ids.shape[1] - 1, tokens.shape[1] - 1):
        steps.append((position, logits.numpy()[0].astype(np.float64), want[position]))
        logits, states = lm.decode(tokens[:, position + 1].numpy(), states)
    return tokens, steps
