"""The selective scan's plan kind."""
from tvm import relax

from scanweaver_core.scan_op import make_scan

from ...form import Plan
from ...steps import tensor_dtype, tensor_shape


class SelectivePlan(Plan):
    """A Mamba selective scan (``selective.py``), where its match says."""

    @classmethod
    def place(cls, rec):
        return [(rec.selective.emit_at, cls(rec))] if rec.selective is not None else None

    def emit(self, rw, binding):
        bb, match = rw.builder_, self.rec.selective
        args = []
        for x, axes, shape, dtype in match.operands:     # each in the spec's layout and dtype
            e = rw.visit_expr(x)
            if axes is not None:
                e = bb.emit(relax.op.permute_dims(e, axes))
            if shape is not None and tensor_shape(e) != tuple(shape):
                e = bb.emit(relax.op.reshape(e, shape))
            if tensor_dtype(e) != dtype:
                e = bb.emit(relax.op.astype(e, dtype))
            args.append(e)
        scan = bb.emit(make_scan(match.spec, args), "selective_scan")
        y = bb.emit(relax.TupleGetItem(scan, 0)) if match.spec.return_last_state else scan
        if match.out_axes is not None:
            y = bb.emit(relax.op.permute_dims(y, match.out_axes))
        if tensor_dtype(y) != match.out_dtype:
            y = bb.emit(relax.op.astype(y, match.out_dtype))
        rw.replace(match.output, y)
        if match.spec.return_last_state:
            rw.replace(self.rec.states[-1], bb.emit(relax.TupleGetItem(scan, 1)))
