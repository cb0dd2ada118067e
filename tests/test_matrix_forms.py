"""Matrix-state recurrences as people write them: each loop must be found as ONE matrix scan,
validated, leave no tensor of the state sequence's size in the fused module, and compile to
what PyTorch computes.  Near misses stay as they were, with a reason."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import scanweaver_tvm as sw
from relax_pass.fuse import fuse
from scanweaver_tvm.matrix_models import BLOCKS, example_input, init_weights

from harness import assert_outputs_match, run_model, torch_outputs
from test_hf_models import tensor_shapes


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def gla_index_none(q, k, v, gk):
    """fla-style naive GLA: ``[..., None]`` outer product and mul + sum readout, stack dim=2."""
    b, h, l, dk = q.shape
    state = torch.zeros(b, h, dk, v.shape[-1])
    outs = []
    for t in range(l):
        state = state * torch.exp(gk[:, :, t])[..., None] + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append((q[:, :, t, :, None] * state).sum(-2))
    return torch.stack(outs, dim=2)


def gla_einsum_negative_dims(q, k, v, gk):
    """einsum outer product and readout, decay through ``unsqueeze(-1)``, stack at dim=-2."""
    state = torch.zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])
    outs = []
    for t in range(q.shape[-2]):
        state = gk[:, :, t].exp().unsqueeze(-1) * state + torch.einsum("bhk,bhv->bhkv", k[:, :, t], v[:, :, t])
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], state))
    return torch.stack(outs, dim=-2)


def gla_inplace_float(q, k, v, gk, h0):
    """fla-style: (B, L, H, .) inputs transposed and ``.float()``ed, a float32 state from h0,
    ``o[:, :, i] = ...`` in place, ``.to(dtype)`` out, the final state returned."""
    dtype = q.dtype
    q, k, v, gk = (x.transpose(1, 2).float() for x in (q, k, v, gk))
    b, h, l, dk = q.shape
    o = torch.zeros_like(v)
    state = q.new_zeros(b, h, dk, v.shape[-1], dtype=torch.float32)
    state += h0.float()
    for i in range(l):
        kv = k[:, :, i][..., None] * v[:, :, i][..., None, :]
        state = state * gk[:, :, i].exp()[..., None] + kv
        o[:, :, i] = (q[:, :, i][..., None] * dk ** -0.5 * state).sum(-2)
    return o.transpose(1, 2).to(dtype), state


def retention_matmul(q, k, v, gamma):
    """Outer product and readout by ``matmul``, a fixed decay per head, pieces cat along time."""
    state = torch.zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])
    outs = []
    for t in range(q.shape[2]):
        state = gamma[:, None, None] * state + k[:, :, t].unsqueeze(-1) @ v[:, :, t].unsqueeze(-2)
        outs.append(q[:, :, t].unsqueeze(-2) @ state)
    return torch.cat(outs, dim=2)


def linear_attention_unbind(q, k, v):
    """No decay, ``unbind`` loop over (B, L, H, .) tensors, a feature map per step, keyword dim."""
    state = torch.zeros(q.shape[0], q.shape[2], q.shape[-1], v.shape[-1])
    outs = []
    for q_t, k_t, v_t in zip(q.unbind(dim=1), k.unbind(dim=1), v.unbind(dim=1)):
        state = state + torch.einsum("bhk,bhv->bhkv", F.elu(k_t) + 1, v_t)
        outs.append(torch.einsum("bhk,bhkv->bhv", F.elu(q_t) + 1, state))
    return torch.stack(outs, dim=1)


def reversed_with_state(q, k, v, g, h0):
    """Backwards in time from h0, a scalar decay per step, outputs reversed back; final state."""
    state = h0
    outs = []
    for t in reversed(range(q.shape[2])):
        state = g[:, :, t, None, None] * state + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append((q[:, :, t, :, None] * state).sum(-2))
    return torch.stack(outs[::-1], dim=2), state


def value_decay(q, k, v, gv):
    """The decay runs over the value dim: ``S * exp(gv_t)[..., None, :]``."""
    state = torch.zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])
    outs = []
    for t in range(q.shape[2]):
        state = state * gv[:, :, t].exp()[..., None, :] + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append((q[:, :, t, :, None] * state).sum(-2))
    return torch.stack(outs, dim=2)


def readout_over_value(q, k, v):
    """The readout contracts the state's LAST dim: ``S @ r_t`` gives a key-sized output."""
    state = torch.zeros(q.shape[0], q.shape[1], k.shape[-1], v.shape[-1])
    outs = []
    for t in range(q.shape[2]):
        state = 0.9 * state + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append((state @ q[:, :, t, :, None]).squeeze(-1))
    return torch.stack(outs, dim=2)


def single_sequence_outer(q, k, v):
    """One (K, V) state, no batch or head: ``torch.outer`` and a vector-matrix readout."""
    state = torch.zeros(k.shape[-1], v.shape[-1])
    outs = []
    for t in range(q.shape[0]):
        state = 0.95 * state + torch.outer(k[t], v[t])
        outs.append(q[t] @ state)
    return torch.stack(outs)


def mamba2_per_step_skip(x, dt, A, B, C, D):
    """Mamba-2's recurrence over (P, N) per head: a scalar decay per (batch, head, step), B and C
    shared by the heads, the D skip added per step, (B, L, H, P) stacked at dim 1."""
    b, l, h, p = x.shape
    state = torch.zeros(b, h, p, B.shape[-1])
    ys = []
    for t in range(l):
        drive = (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, None, None, :]
        state = state * torch.exp(dt[:, t] * A)[..., None, None] + drive
        ys.append((state * C[:, t, None, None, :]).sum(-1) + D[:, None] * x[:, t])
    return torch.stack(ys, dim=1), state


def _bhlk(*shape_last, seed=0, b=2, h=3, length=7):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, length, n, generator=gen) for n in shape_last]


def _gate(shape, seed=1):
    return -torch.rand(shape, generator=torch.Generator().manual_seed(seed))


def _case(name):
    b, h, l, dk, dv = 2, 3, 7, 4, 5
    q, k, v = _bhlk(dk, dk, dv, length=l)
    blhk = [x.transpose(1, 2).contiguous() for x in (q, k, v)]
    cases = {
        "gla_index_none": (gla_index_none, (q, k, v, _gate((b, h, l, dk)))),
        "gla_einsum_negative_dims": (gla_einsum_negative_dims, (q, k, v, _gate((b, h, l, dk)))),
        "gla_inplace_float": (gla_inplace_float, (*blhk, _gate((b, l, h, dk)), torch.randn(b, h, dk, dv))),
        "retention_matmul": (retention_matmul, (q, k, v, torch.rand(h))),
        "linear_attention_unbind": (linear_attention_unbind, tuple(blhk)),
        "reversed_with_state": (reversed_with_state, (q, k, v, torch.rand(b, h, l), torch.randn(b, h, dk, dv))),
        "value_decay": (value_decay, (q, k, v, _gate((b, h, l, dv)))),
        "readout_over_value": (readout_over_value, (_bhlk(dv)[0], k, v)),
        "single_sequence_outer": (single_sequence_outer, (q[0, 0], k[0, 0], v[0, 0])),
        "mamba2_per_step_skip": (mamba2_per_step_skip, (blhk[2], torch.rand(b, l, h), -torch.rand(h),
                                                        torch.randn(b, l, dk), torch.randn(b, l, dk),
                                                        torch.randn(h))),
    }
    return cases[name]


FORMS = ["gla_index_none", "gla_einsum_negative_dims", "gla_inplace_float", "retention_matmul",
         "linear_attention_unbind", "reversed_with_state", "value_decay", "readout_over_value",
         "single_sequence_outer", "mamba2_per_step_skip"]


def _largest_tensor(mod):
    """Elements of the largest tensor any binding of ``main`` holds."""
    largest = 0
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            for ty in _tensor_types(binding.var.ty):
                largest = max(largest, int(np.prod([int(d) for d in ty.shape])))
    return largest


def _tensor_types(ty):
    from tvm import relax

    if isinstance(ty, relax.TupleType):
        return [t for f in ty.fields for t in _tensor_types(f)]
    return [ty] if isinstance(ty, relax.TensorType) and ty.shape is not None else []


def _state_sequence_size(mod):
    """Elements of the state sequence a naive lifting would build, for the one matrix scan."""
    (rec,) = [r for r in fuse(mod)[1] if r.form == "matrix"]
    return int(np.prod(rec.state_shape)) * rec.length


@pytest.mark.parametrize("form", FORMS)
def test_form_is_one_matrix_scan_equal_to_pytorch(form):
    fn, args = _case(form)
    model = Fn(fn)
    mod = sw.from_torch(model, args)
    fused, recs = fuse(mod)
    matrix = [r for r in recs if r.form == "matrix" and not r.rejected]
    assert len(matrix) == 1, [(r, r.matrix_miss) for r in recs]
    assert _largest_tensor(fused) < _state_sequence_size(mod)
    assert "scanweaver.matrix_scan" in fused["main"].script()
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args), rtol=1e-4)


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_block_is_one_matrix_scan_equal_to_pytorch(name):
    model = init_weights(BLOCKS[name]()).eval()
    x = example_input(length=33)
    mod = sw.from_torch(model, (x,))
    fused, recs = fuse(mod)
    matrix = [r for r in recs if r.form == "matrix"]
    assert len(matrix) == 1 and not matrix[0].rejected
    biggest = max(int(np.prod(s)) for s in tensor_shapes(sw.passes("llvm")(mod)))  # Relax and TIR
    assert biggest < _state_sequence_size(mod), "a tensor of the state sequence's size is left"
    assert_outputs_match(run_model(mod, (x,)), torch_outputs(model, (x,)), rtol=1e-4)


def test_mlir_route_says_matrix_scans_are_not_there():
    from relax_pass.lower import LowerScans

    fn, args = _case("gla_index_none")
    with pytest.raises(ValueError, match="matrix-state scans .* not there yet.*use realization='tir'"):
        LowerScans("llvm", realization="mlir")(fuse(sw.from_torch(Fn(fn), args))[0])


def test_nonlinear_state_is_left_with_its_reason():
    def tanh_state(q, k, v):
        state = torch.zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])
        outs = []
        for t in range(q.shape[2]):
            state = torch.tanh(0.9 * state + k[:, :, t, :, None] * v[:, :, t, None, :])
            outs.append((q[:, :, t, :, None] * state).sum(-2))
        return torch.stack(outs, dim=2)

    q, k, v = _bhlk(4, 4, 5)
    mod = sw.from_torch(Fn(tanh_state), (q, k, v))
    fused, recs = fuse(mod)
    assert "scanweaver" not in fused["main"].script()
    assert any(r.rejected and "tanh" in r.reason for r in recs)


def test_readout_before_the_update_is_not_a_matrix_scan():
    """``o_t = q_t S_{t-1}`` (the state before this step's update) is a different layer: the
    matcher says so and the chain stays an affine scan, still equal to PyTorch."""
    def read_then_write(q, k, v):
        state = torch.zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])
        outs = []
        for t in range(q.shape[2]):
            outs.append((q[:, :, t, :, None] * state).sum(-2))
            state = 0.9 * state + k[:, :, t, :, None] * v[:, :, t, None, :]
        return torch.stack(outs, dim=2)

    q, k, v = _bhlk(4, 4, 5)
    model = Fn(read_then_write)
    mod = sw.from_torch(model, (q, k, v))
    recs = fuse(mod)[1]
    assert not any(r.form == "matrix" for r in recs)
    assert_outputs_match(run_model(mod, (q, k, v)), torch_outputs(model, (q, k, v)))


def _numpy(x):
    """A torch tensor as numpy (bf16 through ml_dtypes, which numpy lacks)."""
    import ml_dtypes

    if x.dtype == torch.bfloat16:
        return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return x.numpy()


def _run(mod, args):
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(sw.compile(mod, "llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(_numpy(a)) for a in args])
    return [o.numpy().astype(np.float64) for o in (out if not hasattr(out, "numpy") else [out])]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_with_a_float32_state(dtype):
    """bf16/fp16 activations, the state kept in float32 by the model (``.float()``), the output
    cast back: the scan runs in float32 and the result is PyTorch's to the output's rounding."""
    fn, args = _case("gla_inplace_float")
    args = tuple(a.to(dtype) for a in args)
    model = Fn(fn)
    mod = sw.from_torch(model, args)
    assert [(r.form, r.dtype) for r in fuse(mod)[1] if not r.rejected] == [("matrix", "float32")]
    with torch.no_grad():
        want = [o.double().numpy() for o in model(*args)]
    for got, ref in zip(_run(mod, args), want):
        assert np.abs(got - ref).max() <= 2e-2 * max(1.0, np.abs(ref).max())


def test_half_state_accumulates_in_float32():
    """A state kept in fp16 by the model: the scan keeps it in float32 (what the spec says) and
    writes fp16; it agrees with a float64 run of the same loop to fp16 rounding."""
    def half_state(q, k, v, gk):
        state = torch.zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1], dtype=q.dtype)
        outs = []
        for t in range(q.shape[2]):
            state = state * torch.exp(gk[:, :, t])[..., None] + k[:, :, t, :, None] * v[:, :, t, None, :]
            outs.append((q[:, :, t, :, None] * state).sum(-2))
        return torch.stack(outs, dim=2)

    fn, args = half_state, _case("gla_index_none")[1]
    half = tuple(a.half() for a in args)
    mod = sw.from_torch(Fn(fn), half)
    (rec,) = [r for r in fuse(mod)[1] if not r.rejected]
    assert rec.form == "matrix" and rec.matrix.spec.dtype == "float16"
    got = _run(mod, half)[0]
    want = fn(*(a.double() for a in half)).numpy()
    assert np.abs(got - want).max() <= 1e-2 * max(1.0, np.abs(want).max())


def _gla_scan_body_model(b, h, length, dk, dv):
    """An ONNX ``Scan`` over time (axis 2) whose body carries a (B, H, K, V) state:
    ``h = h * exp(g_t)[..., None] + k_t[..., None] * v_t[..., None, :]``, ``y = sum_k q h``."""
    from onnx import TensorProto, helper

    def vi(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    axes = [helper.make_tensor(n, TensorProto.INT64, [1], [a]) for n, a in (("ax2", 2), ("ax3", 3))]
    node = helper.make_node
    body = helper.make_graph(
        [node("Unsqueeze", ["k_t", "ax3"], ["ku"]), node("Unsqueeze", ["v_t", "ax2"], ["vu"]),
         node("Mul", ["ku", "vu"], ["kv"]), node("Exp", ["g_t"], ["ge"]),
         node("Unsqueeze", ["ge", "ax3"], ["gu"]), node("Mul", ["h", "gu"], ["hg"]),
         node("Add", ["hg", "kv"], ["hn"]), node("Unsqueeze", ["q_t", "ax3"], ["qu"]),
         node("Mul", ["qu", "hn"], ["qh"]), node("ReduceSum", ["qh", "ax2"], ["y_t"], keepdims=0)],
        "body", [vi("h", [b, h, dk, dv]), vi("q_t", [b, h, dk]), vi("k_t", [b, h, dk]),
                 vi("v_t", [b, h, dv]), vi("g_t", [b, h, dk])],
        [vi("hn", [b, h, dk, dv]), vi("y_t", [b, h, dv])], initializer=axes)
    scan = node("Scan", ["h0", "Q", "K", "V", "G"], ["h_last", "Y"], body=body, num_scan_inputs=4,
                scan_input_axes=[2, 2, 2, 2], scan_output_axes=[2], name="gla_scan")
    graph = helper.make_graph(
        [scan], "gla", [vi("h0", [b, h, dk, dv]), vi("Q", [b, h, length, dk]), vi("K", [b, h, length, dk]),
                        vi("V", [b, h, length, dv]), vi("G", [b, h, length, dk])],
        [vi("h_last", [b, h, dk, dv]), vi("Y", [b, h, length, dv])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_onnx_scan_with_a_matrix_state_is_one_matrix_scan():
    import onnxruntime as ort

    b, h, length, dk, dv = 2, 3, 9, 4, 5
    model = _gla_scan_body_model(b, h, length, dk, dv)
    rng = np.random.default_rng(4)
    feeds = {"h0": rng.standard_normal((b, h, dk, dv)), "Q": rng.standard_normal((b, h, length, dk)),
             "K": rng.standard_normal((b, h, length, dk)), "V": rng.standard_normal((b, h, length, dv)),
             "G": -rng.random((b, h, length, dk))}
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    mod = sw.from_onnx(model)
    fused, recs = fuse(mod)
    assert [r.form for r in recs if not r.rejected] == ["matrix"]
    assert "scanweaver.affine_scan" not in fused["main"].script()
    assert _largest_tensor(fused) < b * h * length * dk * dv
    got = run_model(mod, [torch.from_numpy(feeds[k]) for k in ("h0", "Q", "K", "V", "G")])
    assert_outputs_match(got, want, rtol=1e-5)


def test_torch_scan_op_with_a_matrix_state_is_one_matrix_scan():
    from torch._higher_order_ops.scan import scan

    class GLAScan(nn.Module):
        def forward(self, h0, q, k, v, g):          # xs (L, B, H, .)
            def step(state, xs):
                q_t, k_t, v_t, g_t = xs
                state = state * g_t.exp()[..., None] + k_t[..., None] * v_t[..., None, :]
                return state, (q_t[..., None] * state).sum(-2)
            return scan(step, h0, (q, k, v, g))

    length, b, h, dk, dv = 7, 2, 3, 4, 5
    gen = torch.Generator().manual_seed(5)
    args = (torch.randn(b, h, dk, dv, generator=gen), torch.randn(length, b, h, dk, generator=gen),
            torch.randn(length, b, h, dk, generator=gen), torch.randn(length, b, h, dv, generator=gen),
            -torch.rand(length, b, h, dk, generator=gen))
    model = GLAScan()
    mod = sw.from_torch(model, args)
    fused, recs = fuse(mod)
    assert [r.form for r in recs if not r.rejected] == ["matrix"]
    assert "scanweaver.affine_scan" not in fused["main"].script()
    assert_outputs_match(run_model(mod, args), torch_outputs(model, args), rtol=1e-5)


@pytest.mark.parametrize("name", ["gla", "mamba2"])
def test_block_with_symbolic_batch_and_length_compiles_once(name):
    """Traced short, generalized: one executable serves lengths and batches never traced."""
    import tvm
    from torch.export import Dim
    from tvm import relax

    model = init_weights(BLOCKS[name]()).eval()
    arg = "x" if name == "gla" else "hidden"
    mod = sw.from_torch(model, (example_input(length=9),),
                        dynamic_shapes={arg: {0: Dim("batch"), 1: Dim("L")}})
    script = mod.script()
    assert script.count('"scanweaver.matrix_scan"') == 1 and '\\"length\\": \\"L\\"' in script
    vm = relax.VirtualMachine(sw.compile(mod, "llvm"), tvm.cpu())
    for batch, length in ((1, 1), (3, 40), (2, 129)):
        x = example_input(length=length, batch=batch, seed=length)
        got = vm["main"](tvm.runtime.tensor(x.numpy()))
        assert_outputs_match([o.numpy() for o in got], torch_outputs(model, (x,)), rtol=1e-4)
