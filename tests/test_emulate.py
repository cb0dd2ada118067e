"""emulate_gpu: small GPU kernels (README conventions) build for CUDA and, emulated, match numpy."""

import numpy as np
import pytest
import tvm
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from tir_schedules.emulate import BothOrders, emulate_gpu

SYNC = "shared"
CUDA = {"kind": "cuda", "arch": "sm_90"}


def _sync():
    T.evaluate(T.tvm_storage_sync(SYNC))


def _kernel(body, shapes, threads, blocks):
    """PrimFunc `scanweaver_scan(a, out)` with a blockIdx.x x threadIdx.x launch around `body`."""
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("scanweaver_scan")
            T.func_attr({"tirx.noalias": True})
            a = T.arg("a", T.buffer(shapes[0], "float32"))
            out = T.arg("out", T.buffer(shapes[1], "float32"))
            bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
            with T.launch_thread(bx, blocks):
                with T.launch_thread(tx, threads):
                    body(a, out, bx, tx)
    return ib.get()


def _block_scan(rows=3, n=256, nt=64):
    """Hillis-Steele inclusive sum per row: tiles of nt, carry in a local buffer."""
    levels = nt.bit_length() - 1

    def body(a, out, bx, tx):
        sh = T.alloc_shared((nt,), "float32")
        carry = T.alloc_local((1,), "float32")
        v = T.alloc_local((1,), "float32")
        T.buffer_store(carry, T.float32(0), [0])
        with T.serial(0, n // nt) as t:
            T.buffer_store(sh, a[bx, t * nt + tx], [tx])
            _sync()
            with T.serial(0, levels) as lvl:
                k = T.shift_left(1, lvl)
                T.buffer_store(v, sh[tx], [0])
                with T.If(tx >= k):
                    with T.Then():
                        T.buffer_store(v, v[0] + sh[tx - k], [0])
                _sync()
                T.buffer_store(sh, v[0], [tx])
                _sync()
            T.buffer_store(out, sh[tx] + carry[0], [bx, t * nt + tx])
            T.buffer_store(carry, carry[0] + sh[nt - 1], [0])
            _sync()

    return _kernel(body, [(rows, n), (rows, n)], nt, rows)


def _warp_block_scan(blocks=4, nt=128, width=32):
    """Inclusive sum per block: shuffle_up scan per `width` lanes, then segment sums via shared."""
    segs = nt // width

    def body(a, out, bx, tx):
        tot = T.alloc_shared((segs,), "float32")
        v = T.alloc_local((1,), "float32")
        u = T.alloc_local((1,), "float32")
        lane = tx % width
        T.buffer_store(v, a[bx * nt + tx], [0])
        with T.serial(0, width.bit_length() - 1) as i:
            d = T.shift_left(1, i)
            shfl = T.tvm_warp_shuffle_up(T.tvm_warp_activemask(), v[0], d, width, 32)
            T.buffer_store(u, shfl, [0])
            with T.If(lane >= d):
                with T.Then():
                    T.buffer_store(v, v[0] + u[0], [0])
        with T.If(lane == width - 1):
            with T.Then():
                T.buffer_store(tot, v[0], [tx // width])
        _sync()
        with T.serial(0, tx // width) as s:  # thread-dependent, but barrier-free
            T.buffer_store(v, v[0] + tot[s], [0])
        T.buffer_store(out, v[0], [bx * nt + tx])

    return _kernel(body, [(blocks * nt,), (blocks * nt,)], nt, blocks)


def _warp_mix(nt=64, width=8):
    """Per `width` segment: sum by shuffle_down, broadcast of lane 0 and reversal by indexed
    shuffle, xor butterfly max. out[0]=sum, out[1]=reversed input, out[2]=max."""

    def body(a, out, bx, tx):
        v = T.alloc_local((1,), "float32")
        m = T.alloc_local((1,), "float32")
        lane = tx % width
        mask = T.tvm_warp_activemask()
        T.buffer_store(v, a[tx], [0])
        T.buffer_store(m, a[tx], [0])
        T.buffer_store(out, T.tvm_warp_shuffle(mask, a[tx], width - 1 - lane, width, 32), [1, tx])
        d = width // 2
        while d >= 1:
            T.buffer_store(v, v[0] + T.tvm_warp_shuffle_down(mask, v[0], d, width, 32), [0])
            T.buffer_store(m, T.max(m[0], T.tvm_warp_shuffle_xor(mask, m[0], d, width, 32)), [0])
            d //= 2
        T.buffer_store(v, T.tvm_warp_shuffle(mask, v[0], 0, width, 32), [0])
        T.buffer_store(out, v[0], [0, tx])
        T.buffer_store(out, m[0], [2, tx])

    return _kernel(body, [(nt,), (3, nt)], nt, 1)


def _cuda_source(func):
    ex = tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target(CUDA))
    return ex.mod.imports[0].inspect_source()


def _emulate_run(func, a, out_shape):
    ex = tvm.compile(emulate_gpu(func), target="llvm")
    args = [tvm.runtime.tensor(a, tvm.cpu()),
            tvm.runtime.tensor(np.full(out_shape, np.nan, "float32"), tvm.cpu())]
    ex(*args)
    return args[1].numpy()


def test_block_scan_shared_barriers_in_loops():
    func = _block_scan()
    src = _cuda_source(func)
    assert "__syncthreads()" in src and "__shared__" in src
    a = np.random.default_rng(0).standard_normal((3, 256)).astype("float32")
    got = _emulate_run(func, a, a.shape)
    np.testing.assert_allclose(got, np.cumsum(a.astype("float64"), axis=1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("width", [32, 16])
def test_warp_scan_shuffle_up(width):
    func = _warp_block_scan(width=width)
    assert "__shfl_up_sync" in _cuda_source(func)
    a = np.random.default_rng(1).standard_normal(4 * 128).astype("float32")
    got = _emulate_run(func, a, a.shape)
    ref = np.cumsum(a.astype("float64").reshape(4, 128), axis=1).ravel()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)


def test_shuffle_down_indexed_and_xor():
    width, nt = 8, 64
    func = _warp_mix(nt, width)
    src = _cuda_source(func)
    assert "__shfl_down_sync" in src and "__shfl_sync" in src and "__shfl_xor_sync" in src
    a = np.random.default_rng(2).standard_normal(nt).astype("float32")
    got = _emulate_run(func, a, (3, nt))
    seg = a.astype("float64").reshape(-1, width)
    np.testing.assert_allclose(got[0], np.repeat(seg.sum(1), width), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1], a.reshape(-1, width)[:, ::-1].ravel())
    np.testing.assert_array_equal(got[2], np.repeat(a.reshape(-1, width).max(1), width))


def test_emulated_func_has_no_thread_bindings():
    script = emulate_gpu(_block_scan()).script()
    assert "launch_thread" not in script and "tvm_storage_sync" not in script
    assert "shared" not in script


def test_barrier_under_thread_dependent_if_raises():
    def body(a, out, bx, tx):
        sh = T.alloc_shared((32,), "float32")
        T.buffer_store(sh, a[tx], [tx])
        with T.If(tx < 16):
            with T.Then():
                _sync()
        T.buffer_store(out, sh[31 - tx], [tx])

    with pytest.raises(ValueError, match="non-uniform"):
        emulate_gpu(_kernel(body, [(32,), (32,)], 32, 1))


def test_per_thread_bind_across_barrier_raises():
    def body(a, out, bx, tx):
        sh = T.alloc_shared((32,), "float32")
        x = T.Bind(a[tx] * 2)
        T.buffer_store(sh, x, [tx])
        _sync()
        T.buffer_store(out, sh[31 - tx] + x, [tx])

    with pytest.raises(ValueError, match="Bind"):
        emulate_gpu(_kernel(body, [(32,), (32,)], 32, 1))


def _neighbour_sum(barrier):
    """out[tx] = a[tx] + a[tx - 1] through shared memory, with or without the barrier between
    the writes and the reads: without it, the kernel races."""
    def body(a, out, bx, tx):
        sh = T.alloc_shared((32,), "float32")
        T.buffer_store(sh, a[tx], [tx])
        if barrier:
            _sync()
        T.buffer_store(out, sh[tx] + sh[T.max(tx - 1, 0)], [tx])

    return _kernel(body, [(32,), (32,)], 32, 1)


def test_both_thread_orders_agree_with_a_barrier_and_catch_a_missing_one():
    a = np.random.default_rng(4).standard_normal(32).astype("float32")
    want = a + a[np.maximum(np.arange(32) - 1, 0)]

    def run(kernel):
        args = [tvm.runtime.tensor(a, tvm.cpu()), tvm.runtime.tensor(np.full(32, np.nan, "float32"), tvm.cpu())]
        kernel(*args)
        return args[1].numpy()

    build = lambda f: tvm.compile(f, target="llvm")  # noqa: E731
    np.testing.assert_allclose(run(BothOrders(_neighbour_sum(True), build)), want, rtol=1e-6)
    racy = _neighbour_sum(False)
    np.testing.assert_allclose(run(build(emulate_gpu(racy))), want, rtol=1e-6)   # forward order hides it
    with pytest.raises(AssertionError, match="missing barrier"):
        run(BothOrders(racy, build))
