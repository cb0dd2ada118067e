"""The scanweaver dialect file (package data) and verification of custom-stage IR."""
from pathlib import Path

from . import emit
from .tools import mlir_opt

IRDL_FILE = Path(__file__).with_name("scanweaver.irdl.mlir")


def verify(text, what):
    """Parse and verify ``text`` with the dialect loaded; returns mlir-opt's printed form."""
    return mlir_opt(text, [f"--irdl-file={IRDL_FILE}"], what)


def scalar_func(b, name, arg_names, n_results, body):
    """A private f32 helper ``@name(args) -> results``; ``body(dict of args)`` returns results."""
    def emit_body(args):
        b.op("func.return", body(dict(zip(arg_names, args))))
    return emit.func(b, name, ["f32"] * len(arg_names), ["f32"] * n_results, emit_body,
                     attrs={"sym_visibility": emit.attr_str("private")})


def stage_module(b, helpers, arg_types, result_types, body):
    """A module of helper funcs plus ``@scanweaver_scan(args) -> results`` built by ``body``."""
    def emit_body(args):
        b.op("func.return", body(args))
    main = emit.func(b, "scanweaver_scan", arg_types, result_types, emit_body)
    return emit.module([*helpers, main])


def combine_func(b):
    """@scanweaver_combine(a1, u1, a2, u2) = (a2*a1, a2*u1 + u2): the pair combine."""
    from .kernel_common import compose
    return scalar_func(b, "scanweaver_combine", ["a1", "u1", "a2", "u2"], 2,
                       lambda x: list(compose(b, (x["a1"], x["u1"]), (x["a2"], x["u2"]))))
