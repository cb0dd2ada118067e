"""``scanweaver-tvm mlir MODEL``: the IR of each scan through the MLIR realization, stage by stage.

``--stage all`` prints every stage (the paper's Figure 3: ``scanweaver.scan`` -> ``affine_scan``
-> ``assoc_scan`` -> ``blelloch`` -> upstream ``gpu`` -> the CPU route and its LLVM IR);
``--stage NAME`` one of them; ``--stage ptx`` the PTX for ``--arch`` and ptxas's resource report.
"""
from .cli_model import _import_model, model_arg

STAGES = ("all", "ptx", "scanweaver.scan", "affine_scan", "assoc_scan", "blelloch", "gpu", "cpu", "llvm")


def _fused_scans(mod, steps):
    """``(function, var, spec)`` of every scan after FuseAffineRecurrences."""
    from . import api
    from .cli_report import _existing_scans

    with steps("finding recurrences", "cannot fuse the recurrences"):
        fused = api.FuseAffineRecurrences()(mod)
    return _existing_scans(fused)


def _print_ptx(spec, arch, steps):
    import mlir_bridge

    with steps(f"lowering to PTX for {arch} (mlir-opt) and checking it (ptxas)", "cannot make PTX"):
        art = mlir_bridge.cuda_ptx(spec, arch=arch)
        report = art.ptxas if art.ptxas is not None else mlir_bridge.ptxas_check(art.ptx, arch=arch)
    print(art.ptx.rstrip())
    print(f"// ptxas -v -arch={arch}:")
    for kernel, usage in report.items():
        print(f"//   {kernel}: {usage['registers']} registers, {usage['shared_bytes']} B shared memory, "
              f"spills {usage['spill_stores']} B stored / {usage['spill_loads']} B loaded")


def cmd_mlir(args, steps):
    spec_arg = model_arg(args)
    with steps("loading TVM and the MLIR tools", "cannot load the MLIR bridge"):
        import mlir_bridge
        from mlir_bridge import tools

        tools.find("mlir-opt")
    mod = _import_model(spec_arg, args.length, steps)
    scans = _fused_scans(mod, steps)
    if not scans:
        print(f"// {spec_arg}: no scan (no recurrence was fused; `scanweaver-tvm report` says why)")
        return 0
    for i, (function, var, spec) in enumerate(scans):
        if i:
            print()
        print(f"// ===== scan {i}: {var} in {function}: {spec}")
        if args.stage == "ptx":
            _print_ptx(spec, args.arch, steps)
            continue
        with steps("lowering through the MLIR stages", "the MLIR lowering failed"):
            stages = mlir_bridge.stages(spec)
        chosen = [s for s in stages if args.stage in ("all", s.name)]
        for stage in chosen:
            print(f"// ----- stage {stage.name}")
            print(stage.text.rstrip())
    return 0


def add_parser(sub, parents, formatter_class, epilog, default_arch):
    """Register the ``mlir`` subcommand on ``sub`` (the CLI's subparsers)."""
    p = sub.add_parser("mlir", parents=parents, formatter_class=formatter_class,
                       help="print the MLIR of every scan, stage by stage, or its PTX",
                       description="Import MODEL, fuse its recurrences and print each scan's IR "
                                   "through the MLIR realization: the scanweaver dialect stages "
                                   "(verified by mlir-opt with the dialect's IRDL definition), the "
                                   "upstream gpu kernel, the CPU route and its LLVM IR (--stage "
                                   "all, the default), one stage by name, or the PTX with ptxas's "
                                   "register/spill/shared-memory report (--stage ptx).",
                       epilog=epilog)
    p.add_argument("--stage", default="all", choices=STAGES, metavar="STAGE",
                   help=f"all (default), ptx, or one stage: {', '.join(STAGES[2:])}")
    p.add_argument("--arch", default=default_arch, metavar="SM",
                   help=f"CUDA architecture for --stage ptx (default {default_arch})")
    p.set_defaults(run=cmd_mlir)
    return p
