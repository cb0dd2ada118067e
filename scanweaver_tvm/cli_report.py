"""``scanweaver-tvm report MODEL``: one line per recurrence that becomes a scan and per near miss
left as it is (with why), and the module's entry signature, which ``compile`` prints too."""
from .cli_model import _import_model, model_arg


def _span(names):
    return names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"


def _recurrence_line(rec):
    direction = "reverse" if rec.reverse else "forward"
    shape = "x".join(str(d) for d in rec.state_shape) or "scalar"
    return (f"{rec.form:<9} L={rec.length:<5} axis={rec.axis}  {direction:<7}  state {shape} "
            f"{rec.dtype}  in {rec.function} ({len(rec.bindings)} step bindings {_span(rec.bindings)})")


def _near_miss_lines(rejected):
    """One line per finding (the pass already reports a loop's lone steps as one)."""
    return [f"{r.form:<9} in {r.function} ({_span(r.bindings)}): {r.reason}" for r in rejected]


def _existing_scans(mod):
    """Scans already in the module (the ONNX importer makes Scan/Loop into scans directly)."""
    from tvm import relax

    from scanweaver_core.scan_op import parse_scan

    found = []
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        for block in func.body.blocks:
            for binding in block.bindings:
                parsed = parse_scan(getattr(binding, "value", None))
                if parsed is not None:
                    found.append((gvar.name_hint, _name(binding.var), parsed[0]))
    return found


def _spec_line(function, var, spec, origin):
    from scanweaver_core.spec import AffineScanSpec, MatrixScanSpec, StabilizedScanSpec, symbol_name

    if isinstance(spec, StabilizedScanSpec):
        extras = "".join(f" {name}" for name, on in (
            ("den-only", not spec.has_values), ("bonus", spec.has_bonus), ("h0", spec.has_h0),
            ("channel-major", spec.layout == "channel_major")) if on)
        return (f"{'stabilized':<9} L={spec.length:<5} batch={spec.batch} channels={spec.channels} "
                f"decay={spec.decay}{extras} {'reverse' if spec.reverse else 'forward'} {spec.dtype}  "
                f"in {function} ({var}: {origin})")
    if isinstance(spec, MatrixScanSpec):
        extras = "".join(f" {name}" for name, on in (
            ("channel-major", spec.layout == "channel_major"), ("skip", spec.has_skip),
            ("gate", spec.has_gate)) if on)
        return (f"{'matrix':<9} L={symbol_name(spec.length):<5} batch={spec.batch} heads={spec.heads} "
                f"K={spec.key} V={spec.value} decay={spec.decay}{extras} "
                f"{'reverse' if spec.reverse else 'forward'} {spec.dtype}  in {function} ({var}: {origin})")
    if isinstance(spec, AffineScanSpec):
        shape = "x".join(str(d) for d in spec.state_shape) or "scalar"
        direction = "reverse" if spec.reverse else "forward"
        return (f"{'affine':<9} L={symbol_name(spec.length):<5} axis={spec.axis}  {direction:<7}  state {shape} "
                f"{spec.dtype}  in {function} ({var}: {origin})")
    return (f"{'selective':<9} L={symbol_name(spec.length):<5} batch={spec.batch} dim={spec.dim} dstate={spec.dstate} "
            f"{spec.dtype}  in {function} ({var}: {origin})")


def _is_stabilized(spec):
    from scanweaver_core.spec import StabilizedScanSpec

    return isinstance(spec, StabilizedScanSpec)


def cmd_report(args, steps):
    spec = model_arg(args)
    with steps("loading TVM", "cannot load TVM"):
        from . import api
    mod = _import_model(spec, args.length, steps, args.dynamic_dim)
    with steps("analyzing", "cannot analyze the module"):
        found = api.find_recurrences(mod, include_rejected=True)
        existing = _existing_scans(mod)
    accepted = [r for r in found if not r.rejected]
    rejected = [r for r in found if r.rejected]
    near = _near_miss_lines(rejected)
    total = len(accepted) + len(existing)
    print(f"{spec}: {total} recurrence{'s' if total != 1 else ''} to scan, "
          f"{len(near)} near miss{'es' if len(near) != 1 else ''}")
    signature = _signature(mod)
    if signature:
        print(f"  entry: {signature}")
    for rec in accepted:
        print(f"  scan       {_recurrence_line(rec)}")
    for function, var, scan_spec in existing:
        origin = ("fused in every trace, then generalized" if args.dynamic_dim or scan_spec.is_symbolic
                  else "torch.logcumsumexp, imported as a scan" if _is_stabilized(scan_spec)
                  else "an ONNX Scan/Loop, imported as a scan" if spec.kind == "onnx"
                  else "a torch scan, imported as a scan")
        print(f"  scan       {_spec_line(function, var, scan_spec, origin)}")
    for line in near:
        print(f"  left as is {line}")
    if not total and not near:
        print("  (no affine recurrence h = a*h + b found: nothing for ScanWeaver to do)")
    return 0


def _name(var):
    """A Relax Var's name (``.name`` in this TVM, ``.name_hint`` in older ones)."""
    return getattr(var, "name", None) or getattr(var, "name_hint", "?")


def _signature(mod):
    import tvm
    from tvm import relax

    main = mod["main"] if any(g.name_hint == "main" for g in mod.get_global_vars()) else None
    if not isinstance(main, relax.Function):
        return None

    def ty(v):
        t = getattr(v, "ty", None)
        shape = getattr(t, "shape", None)
        try:
            dims = ", ".join(str(int(d)) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in shape)
        except TypeError:            # no static rank
            dims = "..."
        return f"{_name(v)}: {getattr(t, 'dtype', '?')}[{dims}]"

    return "main(" + ", ".join(ty(p) for p in main.params) + ")"
