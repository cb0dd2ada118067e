"""CPU realization of the mLSTM scan (``MLSTMScanSpec``; LLVM target).

Tasks (batch, head, column tile) run in parallel; each walks L with its tile of ``C`` (K x
``lanes`` float32, one vector per row: 8 KB at K = 128, 16 lanes, so it stays in L1), the
head's ``n`` and ``m`` in local buffers (``mlstm_body``).  A step costs 2 K multiply-adds per
column (update and readout), vectorized across the tile's columns, plus K for ``n``; ``exp``
is called three times a step per task (scalars).  Nothing of size (B, H, L, K, V) exists.
"""
from contextlib import contextmanager

from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from scanweaver_core.spec import MLSTMScanSpec, static_or

from .layout import buffer_layout, extent_vars, named
from .mlstm_body import MLSTMTask

NAME = "mlstm_cpu"
TARGET = "cpu"
FORM = "mlstm"


def applies(spec):
    return isinstance(spec, MLSTMScanSpec)


def default_config(spec, cores=2):
    """16 columns a task (one AVX-512 vector), fewer when V is smaller (the next power of
    two), halved down to 4 while there are fewer than 2 tasks per core."""
    lanes = 16
    while lanes > 1 and lanes // 2 >= spec.value:
        lanes //= 2
    heads = static_or(spec.batch, 1 << 30) * spec.heads
    while lanes > 4 and heads * -(-spec.value // lanes) < 2 * cores:
        lanes //= 2
    return {"lanes": lanes}


def generate(spec: MLSTMScanSpec, lanes=16):
    """The PrimFunc ``scanweaver_scan``: parallel (batch, head, column tile) tasks."""
    if lanes < 1:
        raise ValueError(f"lanes: {lanes} < 1")
    tiles = -(-spec.value // lanes)
    resolve = extent_vars(spec)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("scanweaver_scan")
            T.func_attr({"tirx.noalias": True})
            dtypes = spec.buffer_dtypes()
            shapes = {n: tuple(resolve(d) for d in s) for n, s in spec.buffer_shapes().items()}
            bufs = {n: T.arg(n, T.buffer(s, dtypes[n], layout=buffer_layout(s))) for n, s in shapes.items()}
            with T.sblock("root"):
                with T.parallel(0, resolve(spec.batch) * spec.heads * tiles) as task:
                    named("task", task)
                    bh, p = task // tiles, task % tiles

                    @contextmanager
                    def each_lane():
                        with T.vectorized(0, lanes) as w:
                            yield w

                    MLSTMTask(spec, bufs, bh // spec.heads, bh % spec.heads, p * lanes, lanes, each_lane,
                              resolve(spec.length), p == 0, spec.value % lanes != 0).emit()
    return ib.get()
