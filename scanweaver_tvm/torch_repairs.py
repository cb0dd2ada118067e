"""Repairs of what TVM 0.27's torch frontend imports wrongly, applied by ``sw.from_torch``.

Each is a TVM bug that would otherwise reach users as a wrong or uncompilable model:

- ``x[..., -1]`` (``aten.select`` at a negative index) imports as
  ``take(x, -1, mode="fast")``: an out-of-bounds read (Mamba-2's ``A_cumsum[..., -1]`` makes
  the compiled model silently wrong).  A constant index is normalized into range; a run-time
  index gets ``mode="wrap"``, which is PyTorch's meaning of a negative index.  (In-range
  constant indices also get ``mode="clip"``, the same values, without ``fast``'s warning
  printed once per op at build time.)
- ``(mask != 1).cumsum(-1)`` (transformers' packed-sequence check) imports as a ``bool``
  cumsum, which PyTorch computes in int64 and LLVM codegen rejects
  (``CodeGenLLVM::CreateAdd ... MatchesCode(kDLFloat)``).  It becomes a cumsum of the int64
  cast, as in PyTorch.
- ``conv1d`` with bf16/fp16 operands imports with ``out_dtype="float32"`` and then fails adding
  its bias of the input's dtype ("Binary operators must have the same datatype"): a Mamba
  with bf16 weights cannot be imported.  ``convert_conv1d`` computes it as PyTorch's CPU
  kernel does, in float32 from the inputs, rounded to the input dtype.
- ``F.group_norm(x, groups)`` without weight and bias (RetNet's per-head norm) crashes the
  import ("Found null pointer node"): TVM's converter passes the missing weight on as a null.
  ``convert_group_norm`` gives it ones and zeros of the channel count, which is the same norm.
- ``2 ** (-5 - torch.arange(H))`` (an integer power, as retention's gamma is sometimes
  written) imports as an int64 ``power``, which TVM cannot build ("power only applies to
  float").  It is computed in float64 and truncated back to the integer dtype: PyTorch's
  integer power wherever the result fits float64 exactly (|result| <= 2**53; a negative
  exponent gives 0 but for a base of 1 or -1).  A bf16 ``power`` (NemotronH's gated norm,
  ``x.pow(2)`` in bf16) fails alike (TVM's ``pow`` takes no bf16): it is computed in float32
  and rounded to bf16, as PyTorch's CPU kernel does; so is a bf16 ``layer_norm`` /
  ``group_norm`` (RWKV's; TVM's legalization: "only support float32 and float16").
- ``torch.exp2`` (fla's ``naive_retention`` writes its decay with it) has no converter
  ("Unsupported function types ['exp2.default']").  ``convert_exp2`` computes ``2 ** x`` with
  ``power`` in the result's dtype (float32 for an integer ``x``, as PyTorch; float16/bfloat16
  through float32).
- ``torch.cat([torch.tensor([]), keys], dim=-2)`` (transformers' ``DynamicLayer`` on its
  first update) fails the import ("Concat expects all input tensors to have same ndim"):
  PyTorch skips empty 1-D operands of ``cat``, TVM's converter does not.  ``convert_cat``
  drops them as PyTorch does, and promotes mixed dtypes as PyTorch does (a bf16 conv cache
  joined with a float32 value: "Concat expects all input tensors to have the same dtype").
- A parameter whose data is not 64-byte aligned (a bf16 checkpoint loaded from safetensors,
  mapped from the file) fails TVM's DLPack import ("Data is not aligned to 64 bytes"), and its
  fallback through ``.numpy()`` fails for bf16 ("Got unsupported ScalarType BFloat16"): no bf16
  checkpoint could be imported.  ``aligned_constants`` copies such a tensor to fresh
  (aligned) memory first.
- ``linear``, ``matmul`` and ``addmm`` import with ``out_dtype="float32"`` whatever their
  operands: in a bf16 model the result is float32 where PyTorch's is bf16, and the next op
  fails ("Binary operators must have the same datatype": ``addmm``'s bias; a layer norm's
  weight), or the rest of the layer silently runs in another precision than the model's.
  ``torch_dtypes`` casts each converted value whose float dtype differs from the one PyTorch
  gives that node (its ``meta["val"]``) to PyTorch's: a bf16 matmul accumulates in float32 and
  is rounded to bf16, as PyTorch's CPU kernels do.  ``convert_addmm`` adds the bias in
  float32 too (TVM's fails adding a bf16 bias to its float32 product).
"""
import contextlib

import numpy as np
import tvm
from tvm import relax

from scanweaver_core.exprs import op_name, tensor_dtype, tensor_shape


def convert_conv1d(node, importer):
    """``aten.conv1d``: TVM's converter for float32, ours (above) for other dtypes."""
    args = importer.retrieve_args(node)
    bias = args[2] if len(args) > 2 else None
    if _all_float32(args[:2], bias):
        return importer._conv1d(node)  # pylint: disable=protected-access
    stride, padding, dilation, groups = list(args[3:7]) + [1, 0, 1, 1][len(args[3:7]):]
    return _conv1d_in_float32(importer, node, args[0], args[1], bias, stride, padding, dilation, groups)


def convert_convolution(node, importer):
    """``aten.convolution`` (what export decomposes ``nn.Conv1d`` into): ours for a non-float32
    1-D convolution, TVM's converter otherwise."""
    args = importer.retrieve_args(node)
    x, weight, bias, stride, padding, dilation, transposed, _, groups = args
    if _all_float32((x, weight), bias) or transposed or len(importer.shape_of(weight)) != 3:
        return importer._convolution(node)  # pylint: disable=protected-access
    return _conv1d_in_float32(importer, node, x, weight, bias, stride, padding, dilation, groups)


def convert_exp2(node, importer):
    """``aten.exp2``: ``power(2, x)`` in the dtype PyTorch gives it (the node's fake value)."""
    emit = importer.block_builder.emit
    x = importer.env[node.args[0]]
    dtype = _node_dtype(node)
    wide = "float64" if dtype == "float64" else "float32"
    if tensor_dtype(x) != wide:
        x = emit(relax.op.astype(x, wide))
    out = emit(relax.op.power(relax.const(2.0, wide), x))
    return emit(relax.op.astype(out, dtype)) if dtype != wide else out


def convert_cat(node, importer):
    """``aten.cat`` without the empty 1-D operands PyTorch skips, its operands cast to the
    dtype PyTorch promotes them to (the node's own: a bf16 cache and a float32 value make a
    float32 result)."""
    args = importer.retrieve_args(node)
    dim = args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    parts = [x for x in args[0] if not _empty_vector(tensor_shape(x))] or list(args[0])
    dtype = _node_dtype(node)
    if dtype is not None:
        parts = [x if tensor_dtype(x) == dtype else importer.block_builder.emit(relax.op.astype(x, dtype))
                 for x in parts]
    if len(parts) == 1:
        return parts[0]
    return importer.block_builder.emit(relax.op.concat(parts, axis=dim))


@contextlib.contextmanager
def aligned_constants():
    """While importing: TVM's conversion of a constant tensor, given an aligned copy where
    DLPack refuses the tensor itself (bf16 included)."""
    from tvm.relax.frontend.torch import exported_program_translator as ept

    importer = ept.ExportedProgramImporter
    original = importer.__dict__["_convert_pytorch_tensor_to_tvm"]

    def convert(tensor):
        try:
            return original.__func__(tensor)
        except (RuntimeError, TypeError):
            return tvm.runtime.from_dlpack(tensor.detach().cpu().contiguous().clone())

    importer._convert_pytorch_tensor_to_tvm = staticmethod(convert)
    try:
        yield
    finally:
        importer._convert_pytorch_tensor_to_tvm = original


FLOATS = ("float16", "bfloat16", "float32", "float64")


def convert_addmm(node, importer):
    """``beta * x + alpha * (y @ z)`` computed in float32 (float64 for float64 operands) and
    left to ``torch_dtypes`` to round to the node's dtype."""
    x, y, z = (importer.env[a] for a in node.args[:3])
    alpha, beta = node.kwargs.get("alpha", 1), node.kwargs.get("beta", 1)
    emit = importer.block_builder.emit
    wide = "float64" if tensor_dtype(y) == "float64" else "float32"
    out = emit(relax.op.matmul(y, z, out_dtype=wide))
    if alpha != 1:
        out = emit(relax.op.multiply(out, relax.const(alpha, wide)))
    if beta == 0:
        return out
    bias = x if tensor_dtype(x) == wide else emit(relax.op.astype(x, wide))
    if beta != 1:
        bias = emit(relax.op.multiply(bias, relax.const(beta, wide)))
    return emit(relax.op.add(bias, out))


@contextlib.contextmanager
def torch_dtypes():
    """While importing: every converter's tensor result in the float dtype PyTorch gives its
    node (TVM's own converters and the custom ones)."""
    from tvm.relax.frontend.torch import exported_program_translator as ept

    importer = ept.ExportedProgramImporter
    create, update = importer.create_convert_map, importer.update_convert_map

    def kept(builder_of, convert):
        def converted(node, *rest):
            return _as_torch_dtype(builder_of(), node, convert(node, *rest))
        return converted

    def create_kept(self):
        return {k: kept(lambda: self.block_builder, f) for k, f in create(self).items()}

    def update_kept(self, table):
        update(self, {k: kept(lambda: self.block_builder, f) for k, f in table.items()})

    importer.create_convert_map, importer.update_convert_map = create_kept, update_kept
    try:
        yield
    finally:
        importer.create_convert_map, importer.update_convert_map = create, update


def _as_torch_dtype(builder, node, value):
    """``value`` cast to the float dtype of ``node``'s PyTorch value where both are floats and
    differ."""
    want = _node_dtype(node)
    have = tensor_dtype(value) if isinstance(value, relax.Expr) else None
    if have in FLOATS and want in FLOATS and have != want:
        return builder.emit(relax.op.astype(value, want))
    return value


def _node_dtype(node):
    """The dtype PyTorch gives ``node``'s value (``"bfloat16"``, ...), or None (no tensor)."""
    dtype = getattr(getattr(node, "meta", {}).get("val"), "dtype", None)
    return str(dtype).split(".")[-1] if dtype is not None else None


def _empty_vector(shape):
    return shape is not None and len(shape) == 1 and isinstance(shape[0], (int, tvm.tirx.IntImm)) \
        and int(shape[0]) == 0


def convert_topk(node, importer):
    """``aten.topk`` with ``sorted=False`` too (TVM's converter refuses it; MoE routers ask for
    it): the sorted result is one of the orders an unsorted topk may return (PyTorch leaves the
    order unspecified), so a model correct under PyTorch reads it alike."""
    x = importer.env[node.args[0]]
    args = list(node.args) + [None] * (5 - len(node.args))
    k = args[1] if args[1] is not None else node.kwargs.get("k", 1)
    dim = args[2] if args[2] is not None else node.kwargs.get("dim", -1)
    largest = args[3] if args[3] is not None else node.kwargs.get("largest", True)
    return importer.block_builder.emit(relax.op.topk(x, k=k, axis=dim, largest=largest, ret_type="both",
                                                     dtype="int64"))


def convert_group_norm(node, importer):
    """``aten.native_group_norm``: TVM's converter, with a missing weight (bias) as ones (zeros)."""
    x = importer.env[node.args[0]]
    channels = tensor_shape(x)[1]
    args = list(node.args)
    missing = [i for i in (1, 2) if len(args) <= i or args[i] is None]
    if not missing:
        return importer._native_group_norm(node)  # pylint: disable=protected-access
    dtype = tensor_dtype(x)
    gamma, beta = (importer.env[args[i]] if i not in missing else
                   relax.const(np.full((channels,), 1.0 if i == 1 else 0.0, dtype=dtype), dtype)
                   for i in (1, 2))
    num_groups = args[6] if len(args) > 6 else 1
    eps = args[7] if len(args) > 7 else 1e-05
    return importer.block_builder.emit(relax.op.nn.group_norm(
        x, gamma, beta, num_groups=num_groups, channel_axis=1,
        axes=list(range(2, len(tensor_shape(x)))), epsilon=eps))


def _all_float32(tensors, bias):
    return all(tensor_dtype(t) == "float32" for t in (*tensors, *([bias] if bias is not None else [])))


def _conv1d_in_float32(importer, node, x, weight, bias, stride, padding, dilation, groups):
    """The convolution in float32, cast to the dtype PyTorch gives it (the node's fake value)."""
    emit = importer.block_builder.emit
    conv = emit(relax.op.nn.conv1d(emit(relax.op.astype(x, "float32")),
                                   emit(relax.op.astype(weight, "float32")),
                                   strides=stride, padding=padding, dilation=dilation, groups=groups,
                                   data_layout="NCW", kernel_layout="OIW", out_dtype="float32"))
    if bias is not None:
        bias = emit(relax.op.reshape(emit(relax.op.astype(bias, "float32")), (1, -1, 1)))
        conv = emit(relax.op.add(conv, bias))
    dtype = _node_dtype(node)
    return emit(relax.op.astype(conv, dtype)) if dtype != "float32" else conv


def _const_index(expr):
    if isinstance(expr, tvm.ir.GenericConst):
        data = expr.value.numpy()
        return data if data.dtype.kind == "i" else None
    return None


@relax.expr_functor.mutator
class _Repair(relax.PyExprMutator):
    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = super().visit_call_(call)
        name = op_name(call)
        if name == "relax.take" and str(call.attrs.mode) == "fast":
            return self._take(call)
        if name in ("relax.cumsum", "relax.cumprod") and tensor_dtype(call.args[0]) == "bool":
            x = self.builder_.normalize(relax.op.astype(call.args[0], "int64"))
            op = relax.op.cumsum if name == "relax.cumsum" else relax.op.cumprod
            return op(x, call.attrs.axis, "int64", bool(call.attrs.exclusive))
        dtype = tensor_dtype(call)
        if ((name in ("relax.nn.layer_norm", "relax.nn.group_norm") and dtype == "bfloat16")
                or (name == "relax.power" and dtype.startswith(("int", "uint", "bfloat")))):
            return self._computed_wider(call, "float32" if dtype == "bfloat16" else "float64")
        return call

    def _computed_wider(self, call, wide):
        """``call`` on its operands cast to ``wide``, the result cast back to its dtype."""
        args = [self.builder_.normalize(relax.op.astype(a, wide)) for a in call.args]
        return relax.op.astype(self.builder_.normalize(relax.Call(call.op, args, call.attrs)), tensor_dtype(call))

    def _take(self, call):
        x, index = call.args
        axis = int(call.attrs.axis)
        shape = tensor_shape(x)
        data = _const_index(index)
        if data is not None and shape is not None:
            extent = shape[axis % len(shape)]
            if ((data >= -extent) & (data < extent)).all():
                fixed = relax.const(data % extent, str(data.dtype))
                return relax.op.take(x, fixed, axis=axis, mode="clip")
        return relax.op.take(x, index, axis=axis, mode="wrap")


def repair(mod):
    """``mod`` with the imports above repaired (every Relax function, signature re-derived)."""
    repairer = _Repair(mod)
    for gvar, func in list(mod.functions_items()):
        if not isinstance(func, relax.Function):
            continue
        new = repairer.visit_expr(func)
        if not new.same_as(func):
            new = relax.Function(new.params, new.body, None, new.is_pure, new.attrs)
            repairer.builder_.update_func(gvar, new)
    return repairer.builder_.get()
