"""The shared shell of our DLight-style CPU rules (``dense_cpu``, ``elementwise_cpu``,
``short_reduction_cpu``), DLight's own CPU rules behind the same guard, and ``ApplyRules``, the
pass that tries them in order."""
import logging

import tvm
from tvm import s_tir, tirx
from tvm.target import codegen
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule

from .tree_size import inlined_size, tree_size

LOG = logging.getLogger("scanweaver")

# Every rule here inlines a function's intermediate stages (DLight's ``try_inline``, our
# ``compute_inline``s); inlining a stage read k times copies it k times, and a chain of such
# stages grows exponentially, in the inlining and in TVM's build after it (an RNN loop the pass
# leaves alone: 3**24 nodes, a build that does not end).  A function that would be written out
# (``tree_size``) over GROWTH times larger, plus SLACK nodes, is left to the next rule: none of
# ours, so as ``tvm.compile`` leaves it, one loop nest a stage.
GROWTH, SLACK = 8, 4096
# Each inlining rewrites the function around the stage it inlines, so inlining n stages costs
# TVM time ~n**2 (a 92-step loop fused into one function by FuseOps, 256 stages: 1.3 s); a
# function of more stages is left as tvm.compile leaves it.
MAX_STAGES = 64


class GuardedCPURule(CPUScheduleRule):
    """A rule for LLVM targets whose ``schedule(func, target)`` returns a schedule or None;
    a primitive that refuses the function (``RuntimeError``) leaves it as it was (None), and so
    does a function whose inlined stages would grow it past ``GROWTH`` (``inlines_within_bound``)."""

    def schedule(self, func, target):
        raise NotImplementedError

    def apply(self, func, target, _tunable):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        if not inlines_within_bound(func, self.name()):
            return None
        try:
            sch = self.schedule(func, target)
        except RuntimeError:
            return None
        if sch is not None and _has_bf16(func) and not lowers(sch.mod["main"], target):
            LOG.info("%s: schedule refused: TVM's TIR lowering rejects it (bf16 legalization)", self.name())
            return None
        return sch

    def name(self):
        """The rule's name in messages (a wrapped DLight rule: that rule's)."""
        return type(self).__name__


class Guarded(GuardedCPURule):
    """One of DLight's CPU rules (``dl.cpu.Reduction``: norms, softmax, small reductions with
    their epilogue) behind the guard: some of its primitives refuse functions it accepted
    (``RuntimeError``), which would otherwise stop the whole pipeline.  A function whose
    buffers all hold fewer than ``min_elements`` is left serial: waking the thread pool costs
    more than it saves (a decode step's RMS norm of 768 values: 0.26 ms parallel, a few us
    serial)."""

    def __init__(self, rule, min_elements=0):
        super().__init__()
        self.rule, self.min_elements = rule, min_elements

    def name(self):
        return type(self.rule).__name__

    def schedule(self, func, target):
        if _largest_buffer(func) < self.min_elements:
            return None
        return self.rule.apply(func, target, False)


def _has_bf16(func):
    """A parameter buffer of ``func`` holds bf16."""
    return any(getattr(getattr(p, "ty", None), "dtype", None) == "bfloat16" for p in func.params)


def lowers(func, target):
    """TVM's TIR pipeline for ``target`` accepts ``func`` (no code is generated).  Asked of a
    scheduled function with bf16 buffers: TVM 0.27's bf16 storage legalization rejects some
    vectorized forms ("dtype mismatch on BufferStore ... bfloat16x16": a bf16 constant stored
    by a vectorized init; "IntImm can only take scalar, but boolx16": a vectorized select of
    bf16 values), which would otherwise fail the model's build; such a function is left to the
    next rule (TVM builds it unscheduled)."""
    func = func.with_attr("global_symbol", "main")     # (a private function is skipped by
    #                                                    MakePackedAPI, and every pass after it fails)
    mod = tvm.tirx.transform.BindTarget(target.with_host(target))(tvm.IRModule({"main": func}))
    pipeline, finalize_host, _ = tvm.tirx.get_default_tir_pipeline(target)
    try:
        finalize_host()(pipeline(mod))
    except Exception:  # pylint: disable=broad-except  (any refusal: TVM's TypeError, ValueError, InternalError)
        return False
    return True


RULE_ATTR = "scanweaver.rule"


@tvm.transform.module_pass(opt_level=0, name="scanweaver.ApplyRules")
class ApplyRules:  # pylint: disable=too-few-public-methods
    """DLight's ``ApplyDefaultSchedule``: on each unscheduled PrimFunc the rules are tried in
    order, the first schedule kept.  The rule that made it is kept on the function as
    ``scanweaver.rule``: printed with the scheduled TIR, and named by ``sw.compile`` when TVM's
    build runs long (``scanweaver_tvm.compile_watch``)."""

    def __init__(self, *rules):
        self.rules = list(rules)

    def transform_module(self, mod, _ctx):  # pylint: disable=missing-function-docstring
        scheduled = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or int((func.attrs or {}).get("tirx.is_scheduled", 0)) == 1:
                continue
            target = (func.attrs or {}).get("target") or tvm.target.Target.current(allow_none=False)
            for rule in self.rules:
                sch = rule.apply(func, target, False)
                if sch is None:
                    continue
                (sch,) = sch if isinstance(sch, list) else [sch]
                name = rule.name() if isinstance(rule, GuardedCPURule) else type(rule).__name__
                scheduled[gv] = sch.mod["main"].with_attrs({"tirx.is_scheduled": True, RULE_ATTR: name})
                break
        for gv, func in scheduled.items():
            mod[gv] = func
        return mod


_LAST = [None, None]    # the function last judged and its verdict (the rules ask in turn)


def inlines_within_bound(func, rule):
    """``func`` has at most ``MAX_STAGES`` stages, and written out with them inlined
    (``inlined_size``) stays within ``GROWTH`` times its size plus ``SLACK``; where not, says so
    once (logger ``scanweaver``, naming the first ``rule`` that refused it)."""
    if _LAST[0] is not None and _LAST[0].same_as(func):
        return _LAST[1]
    stages = len(func.body.block.alloc_buffers) if isinstance(func.body, s_tir.SBlockRealize) else 0
    if stages > MAX_STAGES:
        LOG.info("%s (and every CPU rule after it) left a function of %d stages unscheduled "
                 "(inlining them costs ~n**2; at most %d are inlined)", rule, stages, MAX_STAGES)
        _LAST[:] = [func, False]
        return False
    before = tree_size(func)
    inlined = inlined_size(func, before)
    ok = inlined <= GROWTH * before + SLACK
    if not ok:
        LOG.info("%s (and every CPU rule after it) left a function unscheduled: inlining its "
                 "stages would write it out as %d nodes, from %d (a stage read several times "
                 "by the next, over a chain)", rule, inlined, before)
    _LAST[:] = [func, ok]
    return ok


def elements(extents):
    """The product of ``extents`` (ints or PrimExprs); a symbolic one makes it unbounded."""
    total = 1
    for e in extents:
        if isinstance(e, tirx.IntImm):
            total *= int(e.value)
        elif isinstance(e, int):
            total *= e
        else:
            return float("inf")
    return total


def _largest_buffer(func):
    """Elements of the largest parameter buffer (a symbolic one counts as unbounded)."""
    shapes = [getattr(getattr(p, "ty", None), "shape", None) for p in func.params]
    return max([elements(shape) for shape in shapes if shape is not None], default=0)


def has_feature(target, feature):
    """The target's CPU has ``feature`` (an LLVM name: ``"avx512f"``); False for a target LLVM
    does not know the CPU of."""
    try:
        return bool(codegen.target_has_features(feature, target))
    except (RuntimeError, ValueError):
        return False


def inline_epilogue(sch, block):
    """Compute the blocks after ``block`` (bias, activation, cast) inside its loops, in order,
    while its tile is hot: the first that does not inline, and all after it, stay whole loops
    of their own."""
    for after in _blocks_after(sch, block):
        if not _sole_consumer(sch, after):
            return
        try:
            sch.reverse_compute_inline(after)
        except RuntimeError:
            return


def _sole_consumer(sch, block):
    """``block`` reads one block's output and is its only reader.  (TVM 0.27's
    ``reverse_compute_inline`` also inlines a consumer whose producer feeds others, and then
    drops the buffer they still read: "Buffer ... is used before its definition".)"""
    producers = sch.get_producers(block)
    return len(producers) == 1 and len(sch.get_consumers(producers[0])) == 1


def _blocks_after(sch, block):
    """The blocks after ``block`` under the root, in order."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    names = [sch.get(b).name_hint for b in blocks]
    return blocks[names.index(sch.get(block).name_hint) + 1:]


def is_weight(func, source):
    """``source`` is a parameter of ``func`` marked layout-free (a constant or weight: the
    ``layout_free_buffers`` ``dense_cpu`` attaches)."""
    attrs = func.attrs or {}
    free = {int(i) for i in attrs["layout_free_buffers"]} if "layout_free_buffers" in attrs else set()
    params = [i for i, p in enumerate(func.params) if p.same_as(source)]
    return bool(params) and params[0] in free
