"""``InPlaceStates``: a step function's returned states written into their parameters' own
buffers where that cannot change a result, and left as fresh tensors where it could.  Each
case is compiled with ``sw.compile`` and run: the results against numpy, and whether the
parameter was updated (the buffer passed in holds the new value after the call)."""
import numpy as np
import pytest
import tvm
from tvm import relax

import scanweaver_tvm as sw
from relax_pass.in_place import IN_PLACE_ATTR

SHAPE = (4, 8)


def _step(body):
    """``step(x, h) -> (y, h')`` with ``body(emit, x, h) -> (y, h')``, asking for h' in place."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    h = relax.Var("h", relax.TensorType(SHAPE, "float32"))
    with bb.function("step", [x, h]):
        with bb.dataflow():
            y, new = body(bb.emit, x, h)
            out = bb.emit_output(relax.Tuple([y, new]))
        bb.emit_func_output(out)
    mod = bb.get()
    mod["step"] = mod["step"].with_attr(IN_PLACE_ATTR, [[1, 1]])
    return relax.VirtualMachine(sw.compile(mod), tvm.cpu())["step"]


def _run(step, want):
    rng = np.random.default_rng(0)
    x, h = rng.standard_normal(SHAPE).astype("float32"), rng.standard_normal(SHAPE).astype("float32")
    h_in = tvm.runtime.tensor(h.copy())
    y, new = step(tvm.runtime.tensor(x), h_in)
    want_y, want_h = want(x, h)
    np.testing.assert_allclose(y.numpy(), want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new.numpy(), want_h, rtol=1e-5, atol=1e-6)
    return np.array_equal(h_in.numpy(), new.numpy()) and not np.array_equal(h, new.numpy())


def test_affine_update_is_in_place():
    """h' = x * h + 1 (each element read where it is written), y = h' * 2 read after."""
    def body(emit, x, h):
        new = emit(relax.op.add(relax.op.multiply(x, h), relax.const(1.0)))
        return emit(relax.op.multiply(new, relax.const(2.0))), new
    assert _run(_step(body), lambda x, h: ((x * h + 1) * 2, x * h + 1))


def test_state_not_read_by_its_kernel_is_in_place():
    """h' = x * 2 does not read h; h's last reader (y = h + x) runs before it."""
    def body(emit, x, h):
        y = emit(relax.op.add(h, x))
        return y, emit(relax.op.multiply(x, relax.const(2.0)))
    assert _run(_step(body), lambda x, h: (h + x, x * 2))


@pytest.mark.parametrize("case", ["reversed", "read_after"])
def test_unsafe_updates_stay_fresh_tensors(case):
    """h' = flip(h) reads other elements than it writes; y = h * 3 after h' reads the old h:
    both keep a fresh tensor, and the results stay right."""
    def body(emit, x, h):
        if case == "reversed":
            new = emit(relax.op.flip(h, axis=1))
            return emit(relax.op.add(x, new)), new
        new = emit(relax.op.add(h, x))
        y = emit(relax.op.multiply(relax.op.sum(new, axis=[1], keepdims=True), h))   # old h, after h'
        return y, new
    want = {"reversed": lambda x, h: (x + h[:, ::-1], h[:, ::-1]),
            "read_after": lambda x, h: ((h + x).sum(1, keepdims=True) * h, h + x)}[case]
    assert not _run(_step(body), want)


@pytest.mark.parametrize("flip", [False, True])
def test_update_written_in_another_shape(flip):
    """The kernel writes h' as (4, 1, 8), returned reshaped to h's (4, 8) (RecurrentGemma's
    ``states[:, -1]``): in place through a reshaped view of h when it reads each element where
    it writes it (the offsets compared in row-major order); reversed, a fresh tensor."""
    def body(emit, x, h):
        src = relax.op.flip(h, axis=1) if flip else h
        wide = emit(relax.op.add(relax.op.multiply(relax.op.expand_dims(x, 1), relax.op.expand_dims(src, 1)),
                                 relax.const(1.0)))
        new = emit(relax.op.reshape(wide, SHAPE))
        return emit(relax.op.multiply(wide, relax.const(2.0))), new      # (y reads the wide one)
    src = (lambda h: h[:, ::-1]) if flip else (lambda h: h)
    assert _run(_step(body), lambda x, h: ((x * src(h) + 1)[:, None] * 2, x * src(h) + 1)) != flip
