"""One kernel for two specs of the same scan on the same bytes.

A ``SelectiveScanSpec`` is a ``MatrixScanSpec`` instance whose buffers are the selective scan's
own, reshaped (``SelectiveScanSpec.as_matrix``, ``MatrixScanSpec.as_selective``;
``SELECTIVE_AS_MATRIX`` pairs the argument names).  So a realization of either serves the
other: ``on_buffers`` re-declares a generated PrimFunc's arguments with the other spec's
shapes and order; its body keeps indexing the buffers it was written for, declared over the
same data (``DeclBuffer``), and nothing is copied.
"""
from tvm import tirx

from scanweaver_core.spec import (SELECTIVE_AS_MATRIX, MatrixScanSpec, SelectiveScanSpec,
                                  is_symbolic, symbol_identifiers, symbol_name)

from .layout import buffer_layout

__all__ = ["counterpart", "on_buffers", "retarget"]


def counterpart(spec):
    """The other spec of the same scan, or None (a matrix scan outside Mamba's form)."""
    if isinstance(spec, SelectiveScanSpec):
        return spec.as_matrix()
    if isinstance(spec, MatrixScanSpec):
        return spec.as_selective()
    return None


def _names(spec):
    """``{argument name of spec: argument name in its counterpart}``."""
    if isinstance(spec, SelectiveScanSpec):
        return SELECTIVE_AS_MATRIX
    return {m: s for s, m in SELECTIVE_AS_MATRIX.items()}


def retarget(func, spec):
    """``func``, generated for ``counterpart(spec)``, as a PrimFunc of ``spec``'s arguments."""
    names = _names(spec)
    return on_buffers(func, [(names[n], n, shape) for n, shape in spec.buffer_shapes().items()],
                      symbol_identifiers(spec))


def on_buffers(func, arguments, identifiers):
    """``func`` with arguments ``(old name, new name, new shape)`` in that order: each new
    buffer holds the bytes of the old one (same dtype and element count, row-major), which the
    body declares over the new one's data; a symbolic extent is a name, resolved through
    ``identifiers`` to the int64 Var the old shapes already use."""
    old = {param.name: param for param in func.params}
    shape_vars = {v.name: v for param in func.params for v in param.ty.shape
                  if isinstance(v, tirx.Var)}
    if sorted(old) != sorted(o for o, _, _ in arguments):
        raise ValueError(f"arguments: {sorted(o for o, _, _ in arguments)} are not the kernel's "
                         f"{sorted(old)}")

    def extent(d):
        return shape_vars[identifiers[symbol_name(d)]] if is_symbolic(d) else d

    params, views = [], []
    for old_name, new_name, shape in arguments:
        shape = [extent(d) for d in shape]
        param = tirx.decl_buffer(shape, old[old_name].ty.dtype, new_name,
                                 layout=buffer_layout(shape))
        params.append(param)
        views.append(tirx.DeclBuffer(old[old_name], data=tirx.buffer_data(param)))
    return tirx.PrimFunc(params, tirx.SeqStmt(views + [func.body]), func.ret_type, func.attrs)
