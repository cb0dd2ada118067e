"""What every spec shares: the dtypes, symbolic extents, checks, and the named-operand views."""
import re


SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")
OUTPUT_KINDS = ("states", "last")


def _check_dtype(dtype):
    dtype = str(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype: {dtype} is not supported; use one of {', '.join(SUPPORTED_DTYPES)}")
    return dtype


def is_symbolic(extent):
    """True for a symbolic extent: a name (``str``), or None (the axis' length ``"L"``)."""
    return extent is None or isinstance(extent, str)


def symbol_name(extent):
    """The name of a symbolic extent (None is ``"L"``)."""
    return "L" if extent is None else extent


def static_or(extent, otherwise):
    """``extent`` when it is a known int, else ``otherwise``: heuristics that size a schedule
    from an extent pick for a symbolic one as for ``otherwise`` (typically a large value)."""
    return otherwise if is_symbolic(extent) else extent


def _identifier(name):
    ident = re.sub(r"\W+", "_", name.strip()).strip("_") or "n"
    return "_" + ident if ident[0].isdigit() else ident


def symbol_identifiers(spec):
    """``{name: identifier}`` of the spec's distinct symbolic extents in first-use order: the
    names of the int64 variables standing for them in kernels and Relax types (unique per spec,
    so ``"L+3"`` and ``"L + 3"`` do not print alike)."""
    from .affine import AffineScanSpec  # pylint: disable=import-outside-toplevel (it imports us)
    extents = spec.shape if isinstance(spec, AffineScanSpec) else (spec.batch, spec.length)
    out = {}
    for extent in extents:
        if is_symbolic(extent) and symbol_name(extent) not in out:
            ident, k = _identifier(symbol_name(extent)), 1
            while ident in out.values():
                ident, k = f"{_identifier(symbol_name(extent))}_{k}", k + 1
            out[symbol_name(extent)] = ident
    return out


def _check_extent(name, value, symbolic_ok=False):
    if value is None and symbolic_ok:
        return None
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(f"{name}: a symbolic extent needs a non-empty name, got {value!r}")
        return value
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: extent must be a positive int or a name (str), got {value!r}")
    return value


def _product(extents):
    """Product of int extents; None when any is symbolic."""
    n = 1
    for d in extents:
        if is_symbolic(d):
            return None
        n *= d
    return n


class NamedOperands:
    """The named-operand views every spec with ``operand_names``/``output_names`` and
    ``buffer_shapes``/``buffer_dtypes`` (all its PrimFunc arguments, in order) shares."""

    def operand_shapes(self):
        """``{name: buffer shape}`` of the inputs, in order."""
        shapes = self.buffer_shapes()
        return {n: shapes[n] for n in self.operand_names()}

    def output_shapes(self):
        """``{name: buffer shape}`` of the outputs, in order."""
        shapes = self.buffer_shapes()
        return {n: shapes[n] for n in self.output_names()}

    def operand_dtypes(self):
        """``{name: dtype}`` of the inputs, in order."""
        dtypes = self.buffer_dtypes()
        return {n: dtypes[n] for n in self.operand_names()}

    def check_operands(self, given, check_dtypes=True):
        """Raise ``ValueError`` naming the first operand of ``given`` (``{name: array}``) whose
        shape, or (``check_dtypes``) dtype, is not this spec's."""
        dtypes = self.operand_dtypes()
        for name, want in self.operand_shapes().items():
            x = given[name]
            if tuple(int(n) for n in x.shape) != want:
                raise ValueError(f"{name}: expected shape {want}, got {tuple(x.shape)}")
            if check_dtypes and str(x.dtype) != dtypes[name]:
                raise ValueError(f"{name}: dtype {x.dtype} is not {dtypes[name]}")
