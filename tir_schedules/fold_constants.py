"""Constant ``call_tir`` calls computed at compile time with one LLVM build for all of them.

TVM 0.27's ``FoldConstant`` builds each PrimFunc it folds as a module of its own (~30 ms each).
A model whose loop is unrolled has hundreds of such calls: ``where(arange == t, ...)`` writes
and slices of constants after legalization (~12 s of the ~15 s a tiny HF RWKV spent in the
pipeline), and a weight packed by ``dense_cpu`` once per call site (minGRU's cell stepped 64
times: 64 builds of one packing function, 2 s).  ``fold_constant_calls`` builds them together
once; ``FoldConstantCalls`` then runs TVM's ``FoldConstant`` for what it left, which finds the
same constants already computed.
"""
import tvm
from tvm import relax

_CALL_TIR = None


def fold_constant_calls(mod):
    """What TVM's ``FoldConstant`` computes for the ``call_tir`` calls of ``mod`` whose arguments
    are constants (or such calls' results), computed with one build: those PrimFuncs in one
    module, built as ``FoldConstant`` builds each (``tirx.build`` for the plain ``llvm``
    target), run in binding order; each folded binding is then bound to its constant
    (``FoldConstant`` propagates it and removes what is left unused).  A call it does not fold
    (a tuple output, a symbolic shape, symbolic arguments) is left to ``FoldConstant``; if the
    build fails, ``mod`` is returned as it was."""
    plans = {}                       # GlobalVar of a relax function -> [(binding, callee, args)]
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            plan = constant_calls(mod, func)
            if plan:
                plans[gv] = plan
    callees = {c for plan in plans.values() for _, c, _ in plan if c is not None}
    if not callees:
        return mod
    names = {c: f"scanweaver_fold_{i}" for i, c in enumerate(sorted(callees, key=lambda g: g.name_hint))}
    built = tvm.IRModule({names[c]: mod[c].with_attr("global_symbol", names[c]) for c in callees})
    try:
        runtime = tvm.tirx.build(built, target=tvm.target.Target("llvm"))
    except Exception:  # pylint: disable=broad-except  (any failure: FoldConstant's builds instead)
        return mod
    out = mod.clone()
    cpu = tvm.cpu()
    for gv, plan in plans.items():
        values = {}
        for binding, callee, args in plan:
            if callee is None:                   # a constant bound to a var, or an alias
                values[binding.var] = args.value if isinstance(args, tvm.ir.expr.Constant) else values[args]
                continue
            ty = binding.var.ty
            result = tvm.runtime.empty(tuple(int(v) for v in ty.shape.values), ty.dtype, cpu)
            runtime[names[callee]](*[values[a] if isinstance(a, relax.Var) else a.value for a in args], result)
            values[binding.var] = result
        out[gv] = _bind_constants(mod[gv], values)
    return out


def _bind_constants(func, values):
    """``func`` with each binding of a var in ``values`` (var -> tensor) bound to that constant."""
    blocks = []
    for block in func.body.blocks:
        bindings = [relax.VarBinding(b.var, relax.const(values[b.var])) if b.var in values else b
                    for b in block.bindings]
        blocks.append(relax.DataflowBlock(bindings) if isinstance(block, relax.DataflowBlock)
                      else relax.BindingBlock(bindings))
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                          func.is_pure, func.attrs)


def constant_calls(mod, func):
    """``[(binding, callee, args)]``: the bindings of ``func`` that ``FoldConstant`` would fold
    (a ``call_tir`` of a PrimFunc in ``mod``, one tensor output of static shape, every argument
    a constant or the result of such a binding), in binding order; a constant bound to a var,
    ``v = c``, or an alias ``v = w`` of a folded value is ``(binding, None, c or w)``."""
    global _CALL_TIR  # pylint: disable=global-statement
    _CALL_TIR = _CALL_TIR or tvm.ir.Op.get("relax.call_tir")
    known, plan = set(), []
    for block in func.body.blocks:
        for binding in block.bindings:
            value = getattr(binding, "value", None)
            if isinstance(value, tvm.ir.expr.Constant) and isinstance(value.ty, relax.TensorType):
                known.add(binding.var)                       # a constant bound to a var
                plan.append((binding, None, value))
                continue
            if isinstance(value, relax.Var) and value in known:
                known.add(binding.var)
                plan.append((binding, None, value))
                continue
            if not (isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR)) or len(value.args) != 2:
                continue
            callee, args = value.args
            if not isinstance(callee, tvm.ir.GlobalVar) or not isinstance(mod[callee], tvm.tirx.PrimFunc):
                continue
            fields = list(args.fields)
            if not all(isinstance(a, tvm.ir.expr.Constant) or (isinstance(a, relax.Var) and a in known)
                       for a in fields):
                continue
            ty = binding.var.ty
            shape = getattr(getattr(ty, "shape", None), "values", None)
            # (one tensor output; ``value.ty_args`` raises in TVM 0.27's bindings: it reads a
            # field named ``sinfo_args`` that the node no longer has)
            if (not isinstance(ty, relax.TensorType) or shape is None
                    or not all(isinstance(v, tvm.tirx.IntImm) for v in shape)):
                continue
            if not fields and _elements(shape) > _MAX_CREATED:
                continue        # (FoldConstant's ShouldBeFolded: no large constant from nothing)
            known.add(binding.var)
            plan.append((binding, callee, fields))
    return plan


_MAX_CREATED = 1024     # TVM 0.27's FoldConstant folds a call without tensor inputs up to this size


def _elements(shape):
    n = 1
    for v in shape:
        n *= int(v)
    return n



@tvm.transform.module_pass(opt_level=0, name="scanweaver.FoldConstantCalls")
def FoldConstantCalls(mod, _ctx):  # pylint: disable=invalid-name  (a pass, named as TVM's are)
    """``fold_constant_calls``, then TVM's ``FoldConstant`` for what it did not fold."""
    return relax.transform.FoldConstant()(fold_constant_calls(mod))
