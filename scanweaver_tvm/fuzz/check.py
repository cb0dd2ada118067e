"""Check one generated case: import, detection, compile with and without the pass, numerics.

Stages and who is to blame when one fails: the case's own source (``invalid``: a generator
bug), ``torch.export`` + TVM's importer and TVM's compile/run of the unchanged module
(``tvm_crash`` / ``tvm_mismatch``: TVM, counted apart), our analysis, rewrite and compile of
the fused module (``crash`` / ``mismatch`` / ``detection``: ours).  A failure is saved as a
runnable reproducer (the case's source with the finding on top) plus a ``.txt`` traceback.

Tolerance: outputs are compared with the model run in float64 on the same (already rounded)
inputs and parameters, relative to ``max(1, max|ref|)``.  A correct implementation in a dtype
is off by roughly what PyTorch itself is off in that dtype (same ops, other association), so
the bound is ``max(FLOOR[dtype], 4 * PyTorch's own error)``; the floor is 1e-4 for fp32 and
16 units of fp16 rounding (2**-11) for fp16.
"""
import copy
import os
import time
import traceback
from dataclasses import asdict, dataclass, field

import numpy as np

FLOOR = {"float32": 1e-4, "float16": 16 * 2.0 ** -11}
OURS = ("mismatch", "crash", "detection", "slow_compile")
COMPILE_RATIO, COMPILE_SLACK_S = 2.0, 3.0


def compile_budget(base_s):
    """The most ``sw.compile`` may take on a module where nothing is fused, given that
    ``tvm.compile`` took ``base_s``: our passes then only analyze and schedule."""
    return COMPILE_RATIO * base_s + COMPILE_SLACK_S
TVM = ("tvm_crash", "tvm_mismatch")


@dataclass
class Result:
    seed: int
    status: str = "ok"              # ok | invalid | one of OURS | one of TVM
    problems: list = field(default_factory=list)   # [kind, stage, message]
    errors: dict = field(default_factory=dict)     # pass / base / torch relative errors
    tolerance: float = 0.0
    found: list = field(default_factory=list)      # repr of every Recurrence (incl. rejected)
    tags: list = field(default_factory=list)
    compile_s: dict = field(default_factory=dict)  # base / pass: seconds to compile
    seconds: float = 0.0
    saved: str = ""
    detail: str = ""

    def add(self, kind, stage, message, detail=""):
        self.problems.append([kind, stage, message])
        self.detail += f"--- {kind} at {stage}: {message}\n{detail}\n"

    def finish(self):
        kinds = [p[0] for p in self.problems]
        for k in ("invalid",) + OURS + TVM:
            if k in kinds:
                self.status = k
                return self
        self.status = "ok"
        return self

    def as_dict(self):
        return asdict(self)


def load(source):
    ns = {"__name__": "scanweaver_fuzz_case"}
    exec(compile(source, "<fuzz case>", "exec"), ns)
    return ns


def check_expectation(recs, expect):
    """What ``find_recurrences(include_rejected=True)`` returned against the case's EXPECT;
    returns a list of complaints (empty when it matches).  An expected ``[form, L, axis,
    reverse]`` field that is ``None`` is not compared."""
    complaints = []
    accepted = [[r.form, r.length, r.axis, r.reverse] for r in recs if not r.rejected]
    unmatched, missing = list(accepted), []
    for e in expect["found"]:
        hit = next((a for a in unmatched if all(w is None or w == g for w, g in zip(e, a))), None)
        if hit is None:
            missing.append(e)
        else:
            unmatched.remove(hit)
    if missing or unmatched:
        complaints.append(f"expected recurrences {expect['found']}, found {accepted}")
    reasons = [r.reason for r in recs if r.rejected]
    for why in expect["rejected"]:
        if not any(why in r for r in reasons):
            complaints.append(f"no near miss reported with reason containing {why!r} (reasons: {reasons})")
    return complaints


def _outputs(out):
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def _run_vm(ex, inputs):
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(ex, tvm.cpu())
    return _outputs(vm["main"](*[tvm.runtime.tensor(a.numpy()) for a in inputs]))


def _rel_error(got, want):
    if len(got) != len(want):
        return float("inf")
    worst = 0.0
    for g, w in zip(got, want):
        g = np.asarray(g, dtype=np.float64)
        if g.shape != w.shape or np.isnan(g).any():
            return float("inf")
        worst = max(worst, float(np.abs(g - w).max(initial=0.0)) / max(1.0, float(np.abs(w).max(initial=0.0))))
    return worst


def check_source(source, seed=None):
    """Run every stage on a case's source; returns a ``Result`` (never raises for a failing case)."""
    import torch
    import tvm

    import scanweaver_tvm as sw
    import tir_schedules

    start = time.time()
    res = Result(seed if seed is not None else -1)
    try:
        ns = load(source)
        res.seed, res.tags, expect = ns["SEED"], list(ns["TAGS"]), ns["EXPECT"]
        model, example = ns["make_model"](), ns["make_inputs"](ns["SEED"])
        fresh = ns["make_inputs"](ns["SEED"] + 1_000_003)
        with torch.no_grad():
            want = [o.double().numpy() for o in copy.deepcopy(model).double()(*[a.double() for a in fresh])]
            eager = [o.double().numpy() for o in model(*fresh)]
        if not all(np.isfinite(w).all() for w in want):
            raise ValueError("the float64 reference is not finite")
    except Exception as e:  # noqa: BLE001 (a broken case is a generator bug, reported as such)
        res.add("invalid", "case", repr(e), traceback.format_exc())
        return _done(res, start)
    res.errors["torch"] = _rel_error(eager, want)
    dtype = str(ns["DTYPE"]).replace("torch.", "")
    res.tolerance = max(FLOOR[dtype], 4 * res.errors["torch"])

    def stage(kind, name, fn):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            res.add(kind, name, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500],
                    traceback.format_exc())
            return None

    mod = stage("tvm_crash", "import", lambda: sw.from_torch(model, example))
    if mod is None:
        return _done(res, start)
    recs = stage("crash", "find_recurrences", lambda: sw.find_recurrences(mod, include_rejected=True))
    if recs is not None:
        res.found = [repr(r) for r in recs]
        for c in check_expectation(recs, expect):
            res.add("detection", "expectation", c)
    fused = stage("crash", "rewrite", lambda: sw.FuseAffineRecurrences()(mod))
    if fused is not None and expect["unchanged"]:
        stage("detection", "unchanged", lambda: tvm.ir.assert_structural_equal(fused, mod))
    base = stage("tvm_crash", "compile without the pass",
                 lambda: _timed(res, "base", lambda: tvm.compile(mod, target=tir_schedules.host_target())))
    ours = stage("crash", "compile with the pass", lambda: _timed(res, "pass", lambda: sw.compile(mod, "llvm")))
    if base is not None and ours is not None and recs is not None and not any(not r.rejected for r in recs):
        if res.compile_s["pass"] > compile_budget(res.compile_s["base"]):
            res.add("slow_compile", "compile", f"nothing fused, yet sw.compile took {res.compile_s['pass']:.1f} s "
                    f"against tvm.compile's {res.compile_s['base']:.1f} s")
    got_base = base and stage("tvm_crash", "run without the pass", lambda: _run_vm(base, fresh))
    got_ours = ours and stage("crash", "run with the pass", lambda: _run_vm(ours, fresh))
    if got_base is not None:
        res.errors["base"] = _rel_error(got_base, want)
        if res.errors["base"] > res.tolerance:
            res.add("tvm_mismatch", "compare", f"TVM without the pass: error {res.errors['base']:.3g} > {res.tolerance:.3g}")
    if got_ours is not None:
        res.errors["pass"] = _rel_error(got_ours, want)
        if res.errors["pass"] > res.tolerance:
            both = res.errors.get("base", 0.0) > res.tolerance
            res.add("tvm_mismatch" if both else "mismatch", "compare",
                    f"with the pass: error {res.errors['pass']:.3g} > {res.tolerance:.3g}"
                    + (" (TVM without the pass is off too)" if both else ""))
    return _done(res, start)


def _timed(res, name, fn):
    """``fn()``, its CPU seconds kept in ``res.compile_s[name]`` (CPU, not wall: another
    process on the machine slows one compile and not the other)."""
    start = time.process_time()
    out = fn()
    res.compile_s[name] = round(time.process_time() - start, 3)
    return out


def _done(res, start):
    res.seconds = round(time.time() - start, 3)
    return res.finish()


def check_case(case, out_dir="fuzz-failures"):
    """Check a generated ``Case``; a failure is saved under ``out_dir`` (None: not saved)."""
    res = check_source(case.source, case.seed)
    if res.status != "ok" and out_dir:
        res.saved = save_failure(case.source, res, out_dir)
    return res


def save_failure(source, res, out_dir):
    """``<status>-seed<seed>.py`` (the reproducer, finding on top) and ``.txt`` (tracebacks)."""
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"{res.status}-seed{res.seed}")
    header = "".join(f"# {kind} at {where}: {msg}\n" for kind, where, msg in res.problems)
    with open(stem + ".py", "w") as f:
        f.write(f"# FAILED ({res.status}); errors {res.errors}, tolerance {res.tolerance:.3g}\n{header}{source}")
    with open(stem + ".txt", "w") as f:
        f.write(res.detail + "\nrecurrences found:\n" + "\n".join(res.found) + "\n")
    return stem + ".py"


def main_for_file(path):
    """The ``__main__`` of a saved case: check it again, print the verdict, 1 when it fails."""
    with open(path) as f:
        res = check_source(f.read())
    print(f"case {res.seed}: {res.status}; errors {res.errors}, tolerance {res.tolerance:.3g}")
    for kind, where, msg in res.problems:
        print(f"  {kind} at {where}: {msg}")
    return 0 if res.status == "ok" else 1
