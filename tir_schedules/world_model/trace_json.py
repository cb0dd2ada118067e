"""A MetaSchedule trace as plain JSON: ``[[inst, ...], [[inst_index, decision], ...]]``.

Each inst is ``[kind_name, inputs, attrs, outputs]`` (the format of ``Trace.as_json`` and of a
``JSONDatabase`` record).  The dataset stores exactly this, and live candidates are converted to
it, so the action encoder reads one format.  Instructions from ``EnterPostproc`` on are dropped:
they are the post-processors' deterministic work, not search decisions.
"""


def plain(obj):
    """Recursively turn TVM FFI containers and immediates into Python lists/dicts/str/int/float."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    kind = type(obj).__name__
    if kind == "IntImm":
        return int(obj.value)
    if kind == "FloatImm":
        return float(obj.value)
    if kind == "StringImm":
        return str(obj.value)
    if hasattr(obj, "items"):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) or hasattr(obj, "__len__") and hasattr(obj, "__getitem__"):
        return [plain(x) for x in obj]
    return str(obj)


def trace_to_json(trace):
    """``trace`` (``tvm.s_tir.Trace``) as plain JSON, decisions included."""
    return plain(trace.as_json(remove_postproc=True))


def search_part(trace_json):
    """``(insts, decisions)``: instructions before ``EnterPostproc``, decisions by inst index."""
    insts, decisions = trace_json[0], trace_json[1] if len(trace_json) > 1 else []
    cut = next((i for i, inst in enumerate(insts) if inst[0] == "EnterPostproc"), len(insts))
    return insts[:cut], {int(i): d for i, d in decisions if int(i) < cut}
