"""CUDA realization of the mLSTM scan (``MLSTMScanSpec``).

One thread per (batch, head, column): its column of ``C`` (K floats), the head's ``n`` and
``m`` in local memory (``mlstm_body``, one lane), L walked sequentially; a block holds
``threads`` columns of one head, so the step's q and k rows are the same address for every
thread of a block (one broadcast load).  This is the direct recurrence, parallel over
B x H x V threads: no chunked (intra-chunk matmul) form yet.
"""
from contextlib import contextmanager

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from scanweaver_core.spec import MLSTMScanSpec

from .layout import extent_vars, grid
from .mlstm_body import MLSTMTask

NAME = "mlstm_gpu"
TARGET = "cuda"
FORM = "mlstm"


def applies(spec):
    return isinstance(spec, MLSTMScanSpec)


def default_config(spec):
    """A block of up to 64 columns (one head's V, rounded up to a warp)."""
    return {"threads": min(64, -(-spec.value // 32) * 32)}


def generate(spec: MLSTMScanSpec, threads=64):
    """The PrimFunc ``scanweaver_scan``: blocks of ``threads`` columns of one head."""
    if not 1 <= threads <= 1024:
        raise ValueError(f"threads: {threads} is not 1 to 1024")
    tiles = -(-spec.value // threads)
    resolve = extent_vars(spec)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("scanweaver_scan")
            T.func_attr({"tirx.noalias": True})
            dtypes = spec.buffer_dtypes()
            bufs = {n: T.arg(n, T.buffer(tuple(resolve(d) for d in s), dtypes[n]))
                    for n, s in spec.buffer_shapes().items()}
            bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
            with T.sblock("root"):
                with T.launch_thread(bx, grid(resolve(spec.batch) * spec.heads * tiles)):
                    with T.launch_thread(tx, threads):
                        bh, p = bx // tiles, bx % tiles

                        @contextmanager
                        def each_lane():
                            yield 0

                        MLSTMTask(spec, bufs, bh // spec.heads, bh % spec.heads, p * threads + tx, 1,
                                  each_lane, resolve(spec.length), tirx.all(p == 0, tx == 0),
                                  spec.value % threads != 0).emit()
    return ib.get()

