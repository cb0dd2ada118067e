"""Random ONNX ``Scan``/``Loop`` models, checked against ONNX Runtime.

``onnx_case(seed)`` draws a model with 1-3 loop-carried states, each updated by one of
``UPDATES`` (the spellings of ``a*h + b`` exporters and people write), per-step coefficients
made from the slices by elementwise ops or ops on feature dims, and per-step outputs of the new
state, the old state or readouts of them; some models hold a near miss (``NEAR_MISSES``) that
must be refused with its reason.  ``check_onnx_case`` imports it with ``sw.from_onnx``, compiles
it for the CPU and compares every output with ONNX Runtime.
``python -m scanweaver_tvm.fuzz.onnx_models --count 200 --seed 0`` runs many.
"""
import argparse
import collections
import json
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# state update h' from h, a (a coefficient in (-1, 1)), x (an input), z (a gate in (0, 1))
UPDATES = {
    "a*h+b": [("Mul", ["a", "h"], "ah"), ("Add", ["ah", "x"], "new")],
    "b+h*a": [("Mul", ["h", "a"], "ha"), ("Add", ["x", "ha"], "new")],
    "h+x": [("Add", ["h", "x"], "new")],
    "x-h*a": [("Mul", ["h", "a"], "ha"), ("Sub", ["x", "ha"], "new")],
    "(h-x)*a": [("Sub", ["h", "x"], "d"), ("Mul", ["d", "a"], "new")],
    "sum3": [("Mul", ["a", "h"], "ah"), ("Add", ["ah", "x"], "s"), ("Add", ["s", "c"], "new")],
    "lerp": [("Sub", ["x", "h"], "d"), ("Mul", ["z", "d"], "zd"), ("Add", ["h", "zd"], "new")],
    "h/2+x": [("Div", ["h", "two"], "hh"), ("Add", ["hh", "x"], "new")],
    "cast": [("Cast64", ["h"], "h64"), ("Cast32", ["h64"], "h32"), ("Mul", ["h32", "a"], "ah"),
             ("Add", ["ah", "x"], "new")],
    "neg": [("Neg", ["h"], "nh"), ("Mul", ["nh", "a"], "ah"), ("Add", ["ah", "x"], "new")],
}
# a coefficient a in (-1, 1) from a slice u: elementwise, or through the feature dim
COEFFICIENTS = {
    "tanh": [("Tanh", ["u"], "a")],
    "sigmoid*0.9": [("Sigmoid", ["u"], "g"), ("Mul", ["g", "c9"], "a")],
    "matmul": [("MatMul", ["u", "W"], "p"), ("Tanh", ["p"], "a")],
    "reduce": [("ReduceMean", ["u"], "m", {"axes": [-1], "keepdims": 1}), ("Tanh", ["m"], "a")],
    "invariant": [("Tanh", ["w"], "a")],
}
OUTPUTS = ("new", "old", "readout", "reduce", "tanh")
NEAR_MISSES = {   # update of state 0 that is not affine, and what the refusal must say
    "tanh": ([("Tanh", ["h"], "t"), ("Add", ["t", "x"], "new")], "not affine in state 0"),
    "square": ([("Mul", ["h", "h"], "hh"), ("Add", ["hh", "x"], "new")], "not affine in state 0"),
    "gate_from_h": ([("Sigmoid", ["h"], "g"), ("Mul", ["g", "h"], "gh"), ("Add", ["gh", "x"], "new")],
                    "not affine in state 0"),
    "coupled": ([("Mul", ["h", "other"], "ho"), ("Add", ["ho", "x"], "new")], "coupled"),
}


@dataclass
class OnnxCase:
    seed: int
    model: onnx.ModelProto
    feeds: dict
    refusal: str = None              # the fragment the error must hold; None: must convert
    tags: list = field(default_factory=list)
    length: int = 0


def onnx_case(seed, max_length=40):
    """A random model (see the module docstring)."""
    rng = np.random.default_rng(seed)
    loop = rng.random() < 0.3
    n_states = int(rng.integers(1, 4))
    length = int(rng.integers(1 if not loop else 2, max_length + 1))
    d = int(rng.integers(1, 6))
    state = [int(rng.integers(1, 4)), d] if rng.random() < 0.6 else [d]
    near = str(rng.choice(sorted(NEAR_MISSES))) if rng.random() < 0.2 else None
    if near == "coupled" and n_states == 1:
        n_states = 2
    b = _Builder(rng, state)
    tags = [f"onnx:{'loop' if loop else 'scan'}", f"onnx:states{n_states}"]
    axes = [int(rng.integers(0, len(state) + 1)) for _ in range(2)] if not loop else [0, 0]
    dirs = [int(rng.integers(0, 2)) for _ in range(2)] if not loop else [0, 0]
    full = [state[:ax] + [length] + state[ax:] for ax in axes]
    body_inputs = [b.vi(f"h{i}", state) for i in range(n_states)]
    if loop:
        body_inputs = [b.vi("iter", [], TensorProto.INT64), b.vi("cond", [], TensorProto.BOOL)] + body_inputs
        slices = []
        for k, ax in enumerate(axes):
            if rng.random() < 0.5:
                b.node("Gather", [f"X{k}", "iter"], f"u{k}" if k == 0 else "x_in", axis=ax)
                slices.append("gather")
            else:
                b.node("Unsqueeze", ["iter", "zero1"], f"st{k}")
                b.node("Add", [f"st{k}", "one1"], f"en{k}")
                b.node("Slice", [f"X{k}", f"st{k}", f"en{k}", f"ax{k}"], f"sl{k}")
                b.node("Squeeze", [f"sl{k}", f"ax{k}"], f"u{k}" if k == 0 else "x_in")
                b.init(f"ax{k}", np.array([ax], np.int64))
                slices.append("slice")
        b.init("zero1", np.array([0], np.int64))
        b.init("one1", np.array([1], np.int64))
        tags += [f"onnx:loop_{s}" for s in slices]
    else:
        body_inputs += [b.vi("u0", state), b.vi("x_in", state)]
        tags += [f"onnx:axes{axes[0]}{axes[1]}", f"onnx:dirs{dirs[0]}{dirs[1]}"]
    outputs, new_names = [], []
    for i in range(n_states):
        form, coef = str(rng.choice(sorted(UPDATES))), str(rng.choice(sorted(COEFFICIENTS)))
        tags += [f"onnx:update:{form}", f"onnx:coef:{coef}"]
        b.scope(i, {"h": f"h{i}", "u": "u0", "x": "x_in", "other": f"h{(i + 1) % n_states}"})
        b.ops(COEFFICIENTS[coef])
        b.ops([("Sigmoid", ["x"], "z")])
        if near is not None and i == 0:
            b.ops(NEAR_MISSES[near][0])
            tags.append(f"onnx:near:{near}")
        else:
            b.ops(UPDATES[form])
        new_names.append(b.name("new"))
    for i in range(n_states):
        b.scope(i, {"h": f"h{i}", "new": new_names[i], "x": "x_in"})
        kind = str(rng.choice(OUTPUTS))
        tags.append(f"onnx:out:{kind}")
        y = {"new": lambda: b.ops([("Identity", ["new"], "y")]),
             "old": lambda: b.ops([("Identity", ["h"], "y")]),
             "readout": lambda: b.ops([("Mul", ["new", "x"], "y")]),
             "reduce": lambda: b.ops([("Mul", ["new", "x"], "py"), ("ReduceSum", ["py"], "y", {"axes": [-1], "keepdims": 1})]),
             "tanh": lambda: b.ops([("Tanh", ["new"], "y")])}[kind]
        y()
        outputs.append((b.name("y"), kind))
    body_outs = [b.vi(n, state) for n in new_names] + [b.vi(y, None) for y, _ in outputs]
    if loop:
        b.node("Identity", ["cond"], "cond_out")
        body_outs = [b.vi("cond_out", [], TensorProto.BOOL)] + body_outs
    body = helper.make_graph(b.nodes, "body", body_inputs, body_outs, initializer=b.inits)
    outer_in = [b.vi(f"h0_{i}", state) for i in range(n_states)] + [b.vi(f"X{k}", full[k]) for k in range(2)]
    finals = [f"last{i}" for i in range(n_states)]
    stacked = [f"Y{j}" for j in range(len(outputs))]
    if loop:
        node = helper.make_node("Loop", ["M", "", *[f"h0_{i}" for i in range(n_states)]], finals + stacked,
                                name="the_loop", body=body)
        outer_inits = [numpy_helper.from_array(np.array(length, np.int64), "M")]
    else:
        out_axes = [int(rng.integers(0, len(state) + 1)) if kind != "reduce" else 0 for _, kind in outputs]
        node = helper.make_node("Scan", [f"h0_{i}" for i in range(n_states)] + ["X0", "X1"], finals + stacked,
                                name="the_scan", body=body, num_scan_inputs=2, scan_input_axes=axes,
                                scan_input_directions=dirs, scan_output_axes=out_axes,
                                scan_output_directions=[int(rng.integers(0, 2)) for _ in outputs])
        outer_inits = []
    graph = helper.make_graph([node], "g", outer_in, [helper.make_empty_tensor_value_info(o) for o in finals + stacked],
                              initializer=outer_inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {f"h0_{i}": rng.standard_normal(state).astype(np.float32) for i in range(n_states)}
    feeds.update({f"X{k}": rng.standard_normal(full[k]).astype(np.float32) for k in range(2)})
    refusal = NEAR_MISSES[near][1] if near is not None else None
    return OnnxCase(seed, model, feeds, refusal, tags, length)


class _Builder:
    """Body nodes with names scoped per state (``new`` of state 1 is ``new_1``)."""

    def __init__(self, rng, state):
        self.rng, self.state, self.nodes, self.inits = rng, state, [], []
        self.env, self.suffix, self.count, self.constants = {}, "", 0, set()
        d = state[-1]
        self.init("W", (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32))
        self.init("w", rng.standard_normal(state).astype(np.float32))
        self.init("c", rng.standard_normal(d).astype(np.float32))
        self.init("c9", np.float32(0.9))
        self.init("two", np.float32(2.0))

    def vi(self, name, shape, dtype=TensorProto.FLOAT):
        return helper.make_tensor_value_info(name, dtype, shape)

    def init(self, name, value):
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        self.constants.add(name)

    def scope(self, i, env):
        self.env, self.suffix = dict(env), f"_{i}"

    def name(self, local):
        if local in self.constants:
            return local
        return self.env.get(local, f"{local}{self.suffix}")

    def node(self, op, ins, out, **attrs):
        self.count += 1
        self.nodes.append(helper.make_node(op, ins, [out], name=f"n{self.count}_{op}", **attrs))

    def ops(self, ops):
        for op, ins, out, *attrs in ops:
            names = [self.name(x) for x in ins]
            target = f"{out}{self.suffix}"
            attrs = dict(attrs[0]) if attrs else {}
            if op in ("Cast64", "Cast32"):
                self.node("Cast", names, target, to=TensorProto.DOUBLE if op == "Cast64" else TensorProto.FLOAT)
            elif op == "ReduceSum":             # (opset 17: ReduceMean takes axes as an attribute)
                self.init(f"axes{self.count}", np.array(attrs.pop("axes"), np.int64))
                self.node(op, names + [f"axes{self.count}"], target, **attrs)
            else:
                self.node(op, names, target, **attrs)
            self.env[out] = target


def check_onnx_case(case):
    """``(status, detail)``: ``ok``, ``refused`` (a near miss, with the right reason),
    ``mismatch``, ``missed`` (a near miss converted or refused for another reason), ``crash``."""
    import onnxruntime as ort  # pylint: disable=import-outside-toplevel
    import tvm  # pylint: disable=import-outside-toplevel
    from tvm import relax  # pylint: disable=import-outside-toplevel

    import scanweaver_tvm as sw  # pylint: disable=import-outside-toplevel
    from scanweaver_tvm.onnx_frontend import UnsupportedRecurrence  # pylint: disable=import-outside-toplevel
    try:
        mod = sw.from_onnx(case.model)
    except UnsupportedRecurrence as err:
        if case.refusal is not None and case.refusal in str(err):
            return "refused", str(err)
        return ("missed" if case.refusal is not None else "crash"), str(err)
    if case.refusal is not None:
        return "missed", "a near miss was converted"
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 3               # (unused initializers are expected)
        want = ort.InferenceSession(case.model.SerializeToString(), options,
                                    providers=["CPUExecutionProvider"]).run(None, case.feeds)
        vm = relax.VirtualMachine(sw.compile(mod, "llvm"), tvm.cpu())
        names = [i.name for i in case.model.graph.input]
        got = vm["main"](*[tvm.runtime.tensor(case.feeds[n]) for n in names])
        got = [got] if isinstance(got, tvm.runtime.Tensor) else list(got)
    except Exception as err:  # pylint: disable=broad-except
        return "crash", f"{type(err).__name__}: {err}"
    for i, (g, w) in enumerate(zip(got, want)):
        g = g.numpy()
        if g.shape != w.shape or g.dtype != w.dtype:
            return "mismatch", f"output {i}: {g.dtype}{g.shape}, onnxruntime {w.dtype}{w.shape}"
        err = float(np.abs(g - w).max()) / max(1.0, float(np.abs(w).max())) if w.size else 0.0
        if err > 1e-4:
            return "mismatch", f"output {i}: relative error {err:.3g}"
    return "ok", ""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-length", type=int, default=40)
    ap.add_argument("--out", default=None, help="summary JSON")
    args = ap.parse_args(argv)
    status, per_tag, failures, start = collections.Counter(), collections.Counter(), [], time.time()
    for seed in range(args.seed, args.seed + args.count):
        case = onnx_case(seed, args.max_length)
        result, detail = check_onnx_case(case)
        status[result] += 1
        per_tag.update(case.tags)
        if result not in ("ok", "refused"):
            failures.append({"seed": seed, "status": result, "detail": detail[:500], "tags": case.tags})
            print(f"seed {seed}: {result}: {detail[:300]}", flush=True)
    summary = {"count": args.count, "seeds": [args.seed, args.seed + args.count - 1],
               "max_length": args.max_length, "status": dict(status), "per_tag": dict(sorted(per_tag.items())),
               "failures": failures, "seconds": round(time.time() - start, 1)}
    print(json.dumps({k: summary[k] for k in ("count", "status", "seconds")}))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
