"""ONNX Scan / Loop -> ScanWeaver scan: onnxruntime is the oracle for every converted model."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import scanweaver_tvm as sw
from relax_pass.lower import LowerScans
from scanweaver_tvm.onnx_frontend import UnsupportedRecurrence, from_onnx

OPSET = 17


def vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def node(op, ins, outs, name=None, **attrs):
    return helper.make_node(op, ins, outs, name=name or f"{op.lower()}_{outs[0]}", **attrs)


def model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def scan_model(body_nodes, state, xs, *, axes=None, dirs=None, out_axes=None, out_dirs=None,
               collect=1, final=True, inits=()):
    """Scan over inputs X0.. (full shapes ``xs``) with body inputs h, x0_t.. and body outputs
    hn, y0_t.. (``collect`` of them, each Identity(hn) unless the body defines it)."""
    m, axes = len(xs), axes or [0] * len(xs)
    slices = [s[:ax] + s[ax + 1:] for s, ax in zip(xs, axes)]
    collected = [f"y{j}_t" for j in range(collect)]
    defined = {o for n in body_nodes for o in n.output}
    body_nodes = body_nodes + [node("Identity", ["hn"], [y]) for y in collected if y not in defined]
    body = helper.make_graph(body_nodes, "body", [vi("h", state)] + [vi(f"x{i}_t", s) for i, s in enumerate(slices)],
                             [vi("hn", state)] + [vi(y, None) for y in collected])
    out_shape = lambda ax: state[:ax] + [xs[0][axes[0]]] + state[ax:]  # noqa: E731
    out_axes = out_axes or [0] * collect
    attrs = dict(body=body, num_scan_inputs=m, scan_input_axes=axes, scan_input_directions=dirs or [0] * m)
    if collect:
        attrs.update(scan_output_axes=out_axes, scan_output_directions=out_dirs or [0] * collect)
    # onnxruntime rejects an omitted ("") Scan output, so an unused final state gets a name
    outs = ["h_last" if final else "h_unused"] + [f"Y{j}" for j in range(collect)]
    scan = helper.make_node("Scan", ["h0"] + [f"X{i}" for i in range(m)], outs, name="the_scan", **attrs)
    graph_outs = ([vi("h_last", state)] if final else []) + [vi(f"Y{j}", out_shape(out_axes[j])) for j in range(collect)]
    return model([scan], [vi("h0", state)] + [vi(f"X{i}", s) for i, s in enumerate(xs)], graph_outs, inits)


def check(onnx_model, feeds, expected=None, scans=None, same_dtype=True):
    """Run with onnxruntime (unless ``expected`` is given) and through from_onnx -> LowerScans
    -> VM; compare every output's shape, dtype (unless ``same_dtype`` is off: a float64 oracle)
    and values.  ``scans``: how many scans the module must hold (default: some)."""
    if expected is None:
        sess = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
        expected = sess.run(None, feeds)
    imported = from_onnx(onnx_model)
    found = imported.script().count('"scanweaver.affine_scan"')
    assert found == scans if scans is not None else found >= 1, found
    mod = LowerScans("llvm")(imported)
    vm = relax.VirtualMachine(tvm.compile(mod, target=tvm.target.Target("llvm")), tvm.cpu())
    names = [i.name for i in onnx_model.graph.input]
    got = vm["main"](*[tvm.runtime.tensor(feeds[n]) for n in names])
    got = [got] if isinstance(got, tvm.runtime.Tensor) else list(got)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.numpy().shape == np.asarray(e).shape
        assert g.numpy().dtype == np.asarray(e).dtype or not same_dtype
        np.testing.assert_allclose(g.numpy(), e, rtol=1e-5, atol=1e-5)


def feeds(rng, state, xs, coef=(0,)):
    """h0 and X0..; inputs listed in ``coef`` are coefficients in [-1, 1] (bounded recurrence)."""
    out = {"h0": rng.standard_normal(state).astype(np.float32)}
    for i, s in enumerate(xs):
        x = rng.uniform(-1, 1, s) if i in coef else rng.standard_normal(s)
        out[f"X{i}"] = x.astype(np.float32)
    return out


AFFINE_BODIES = {  # body computing hn from h, x0_t (a) and x1_t (b), in different operand orders
    "h*a+b": [node("Mul", ["h", "x0_t"], ["ah"]), node("Add", ["ah", "x1_t"], ["hn"])],
    "b+a*h": [node("Mul", ["x0_t", "h"], ["ah"]), node("Add", ["x1_t", "ah"], ["hn"])],
    "(h-b)*a/2": [node("Sub", ["h", "x1_t"], ["d"]), node("Mul", ["d", "x0_t"], ["m"]),
                  node("Div", ["m", "two"], ["hn"]), node("Constant", [], ["two"], name="two",
                                                      value=numpy_helper.from_array(np.float32(2.0)))],
}


@pytest.mark.parametrize("length", [1, 7, 64])
@pytest.mark.parametrize("form", sorted(AFFINE_BODIES))
def test_forward_scan_axis0(form, length):
    body = AFFINE_BODIES[form]
    if form == "(h-b)*a/2":  # the Constant must precede its use
        body = [body[3]] + body[:3]
    state, xs = [3, 4], [[length, 3, 4]] * 2
    check(scan_model(body, state, xs), feeds(np.random.default_rng(length), state, xs))


@pytest.mark.parametrize("length", [1, 7, 64])
def test_reverse_scan_axis1(length):
    state, xs = [2, 5], [[2, length, 5], [2, length, 5]]
    m = scan_model(AFFINE_BODIES["b+a*h"], state, xs, axes=[1, 1], dirs=[1, 1], out_axes=[1])
    check(m, feeds(np.random.default_rng(length), state, xs))


def test_mixed_axes_and_directions():
    """a runs forward along axis 0, b backward along axis 1 of a (5,L) tensor; two collected
    outputs, one stacked on axis 1, one reversed on axis 0."""
    state, xs, length = [5], [[9, 5], [5, 9]], 9
    body = AFFINE_BODIES["h*a+b"] + [node("Identity", ["hn"], ["y1_t"])]
    m = scan_model(body, state, xs, axes=[0, 1], dirs=[0, 1], out_axes=[1, 0], out_dirs=[0, 1], collect=2)
    check(m, feeds(np.random.default_rng(length), state, xs))


@pytest.mark.parametrize("length", [1, 7, 64])
def test_slices_broadcast_over_batch(length):
    """a_t per channel (a (L, 4) input, broadcast over the batch), b_t per (batch, channel) from a
    (2, L, 4) input, both read backwards; the stacked states go on axis 1."""
    state, xs = [2, 4], [[length, 4], [2, length, 4]]
    m = scan_model(AFFINE_BODIES["b+a*h"], state, xs, axes=[0, 1], dirs=[1, 1], out_axes=[1])
    check(m, feeds(np.random.default_rng(length), state, xs))


@pytest.mark.parametrize("length", [1, 7, 64])
def test_loop_invariant_decay_and_gates(length):
    """EMA with a learned decay: a = sigmoid(w) (an initializer, per channel), b = (1-a)*x_t*g_t
    with g_t = Sigmoid(x_t) computed on the slice; the state is (batch, channels)."""
    rng = np.random.default_rng(length)
    w = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "w")
    one = numpy_helper.from_array(np.float32(1.0), "one")
    body = [node("Sigmoid", ["w"], ["a"]), node("Sub", ["one", "a"], ["oma"]),
            node("Sigmoid", ["x0_t"], ["g"]), node("Mul", ["x0_t", "g"], ["xg"]),
            node("Mul", ["oma", "xg"], ["b"]), node("Mul", ["a", "h"], ["ah"]), node("Add", ["ah", "b"], ["hn"])]
    state, xs = [2, 4], [[2, length, 4]]
    m = scan_model(body, state, xs, axes=[1], out_axes=[1], inits=[w, one])
    check(m, feeds(rng, state, xs, coef=()))


@pytest.mark.parametrize("length", [1, 7, 64])
@pytest.mark.parametrize("op", ["Add", "Sub"])
def test_cumsum_like(op, length):
    state, xs = [6], [[length, 6]]
    m = scan_model([node(op, ["h", "x0_t"], ["hn"])], state, xs)
    check(m, feeds(np.random.default_rng(length), state, xs, coef=()))


@pytest.mark.parametrize("which", ["final", "states", "both", "states_same_tensor"])
def test_outputs(which):
    state, xs = [3], [[7, 3], [7, 3]]
    body = AFFINE_BODIES["h*a+b"]
    if which == "final":
        m = scan_model(body, state, xs, collect=0)
    else:
        m = scan_model(body, state, xs, final=which == "both")
    fs = feeds(np.random.default_rng(0), state, xs)
    if which == "states_same_tensor":  # the body lists hn itself as its scan output; onnxruntime
        m.graph.node[0].attribute[0].g.output[1].name = "hn"  # gets that wrong, so numpy checks it
        h, ys = fs["h0"].astype(np.float64), []
        for a, b in zip(fs["X0"], fs["X1"]):
            h = h * a + b
            ys.append(h)
        check(m, fs, [np.array(ys)], same_dtype=False)
    else:
        check(m, fs)


def loop_model(length, body_nodes, trip=None, cond=True, collect=True, extra_inits=()):
    """h = a_i*h + b_i for i < M with a_i = A[i] (axis 0), b_i = B[:, i] (axis 1)."""
    body = helper.make_graph(
        [node("Gather", ["A", "i"], ["a_i"], axis=0), node("Gather", ["B", "i"], ["b_i"], axis=1)] + body_nodes
        + [node("Identity", ["c"], ["c_out"])] + ([node("Identity", ["hn"], ["y"])] if collect else []),
        "body", [vi("i", [], TensorProto.INT64), vi("c", [], TensorProto.BOOL), vi("h", [3])],
        [vi("c_out", [], TensorProto.BOOL), vi("hn", [3])] + ([vi("y", [3])] if collect else []))
    inits = [numpy_helper.from_array(np.array(length if trip is None else trip, np.int64), "M"),
             numpy_helper.from_array(np.array(cond), "cond"), *extra_inits]
    loop = helper.make_node("Loop", ["M", "cond", "h0"], ["h_last"] + (["Y"] if collect else []),
                            name="the_loop", body=body)
    outs = [vi("h_last", [3])] + ([vi("Y", [trip or length, 3])] if collect else [])
    return model([loop], [vi("h0", [3]), vi("A", [length, 3]), vi("B", [3, length])], outs, inits)


@pytest.mark.parametrize("length", [1, 7, 64])
@pytest.mark.parametrize("cond_out", ["identity", "constant_true"])
def test_loop(length, cond_out):
    body = [node("Mul", ["h", "a_i"], ["ah"]), node("Add", ["b_i", "ah"], ["hn"])]
    rng = np.random.default_rng(length)
    fs = {"h0": rng.standard_normal(3), "A": rng.uniform(-1, 1, (length, 3)), "B": rng.standard_normal((3, length))}
    m = loop_model(length, body)
    if cond_out == "constant_true":  # the condition output is a Constant node, not Identity(c)
        m.graph.node[0].attribute[0].g.node[-2].CopyFrom(helper.make_node(
            "Constant", [], ["c_out"], name="always", value=numpy_helper.from_array(np.array(True))))
    check(m, {k: v.astype(np.float32) for k, v in fs.items()}, scans=1 if length > 1 else 0)


def test_loop_fewer_steps_than_rows_final_only():
    body = [node("Mul", ["h", "a_i"], ["ah"]), node("Add", ["b_i", "ah"], ["hn"])]
    rng = np.random.default_rng(1)
    fs = {"h0": rng.standard_normal(3), "A": rng.uniform(-1, 1, (9, 3)), "B": rng.standard_normal((3, 9))}
    check(loop_model(9, body, trip=5, collect=False), {k: v.astype(np.float32) for k, v in fs.items()})


def expect_error(onnx_model_or_path, *fragments):
    with pytest.raises(ValueError) as info:
        from_onnx(onnx_model_or_path)
    for f in fragments:
        assert f in str(info.value), str(info.value)
    return info.value


AXIS0 = node("Constant", [], ["ax"], name="axis0", value=numpy_helper.from_array(np.int64(0)))


@pytest.mark.parametrize("body,fragments", [
    ([node("Tanh", ["h"], ["t"], name="squash"), node("Add", ["t", "x0_t"], ["hn"])],
     ["the_scan", "'squash' (Tanh)", "not affine in state 0"]),
    ([node("Mul", ["h", "h"], ["hh"], name="square"), node("Add", ["hh", "x0_t"], ["hn"])],
     ["the_scan", "'square' (Mul)", "not affine in state 0"]),
    ([node("Sigmoid", ["h"], ["g"], name="gate"), node("Mul", ["g", "h"], ["hn"])],
     ["the_scan", "'gate' (Sigmoid)"]),
    ([AXIS0, node("CumSum", ["x0_t", "ax"], ["s"], name="running"), node("Add", ["h", "s"], ["hn"])],
     ["the_scan", "'running' (CumSum)", "does not commute with slicing"]),
])
def test_non_affine_bodies(body, fragments, capsys):
    err = expect_error(scan_model(body, [3], [[7, 3]]), *fragments)
    assert isinstance(err, UnsupportedRecurrence)
    assert "Error converting operator" not in capsys.readouterr().out  # TVM's dump is dropped


@pytest.mark.parametrize("length", [1, 9])
def test_feature_ops_on_slices(length):
    """Per-step values through ops that act on the feature dims only (a reduction, a MatMul with
    a weight, a Softmax) run on the whole sequence at once."""
    rng = np.random.default_rng(length)
    w = numpy_helper.from_array(rng.standard_normal((3, 3)).astype(np.float32), "w")
    body = [node("ReduceSum", ["x0_t"], ["s"], name="pool", keepdims=1), node("MatMul", ["x0_t", "w"], ["p"]),
            node("Softmax", ["p"], ["g"], axis=-1), node("Mul", ["h", "g"], ["hg"]), node("Add", ["hg", "s"], ["hn"])]
    state, xs = [3], [[length, 3]]
    check(scan_model(body, state, xs, inits=[w]), feeds(rng, state, xs), scans=1)


def two_state_scan(body_nodes, outputs=("hn", "gn")):
    body = helper.make_graph(body_nodes, "body", [vi("h", [3]), vi("g", [3]), vi("x", [3])],
                             [vi("hn", [3]), vi("gn", [3])] + [vi(o, [3]) for o in outputs[2:]])
    scan = helper.make_node("Scan", ["h0", "g0", "X"], ["hl", "gl"] + [f"Y{j}" for j in range(len(outputs) - 2)],
                            name="pair", body=body, num_scan_inputs=1)
    return model([scan], [vi("h0", [3]), vi("g0", [3]), vi("X", [7, 3])],
                 [vi("hl", [3]), vi("gl", [3])] + [vi(f"Y{j}", [7, 3]) for j in range(len(outputs) - 2)])


def test_two_states_and_outputs_of_the_states():
    """Two independent states (an EMA and a running sum) and per-step outputs computed from the
    new states, the old state and the input: one scan per state."""
    half = numpy_helper.from_array(np.float32(0.5), "half")
    body = [node("Constant", [], ["c"], name="c", value=half),
            node("Mul", ["h", "c"], ["hc"]), node("Add", ["hc", "x"], ["hn"]), node("Add", ["g", "x"], ["gn"]),
            node("Mul", ["hn", "gn"], ["prod"]), node("Sub", ["h", "x"], ["old"]), node("Tanh", ["hn"], ["th"])]
    m = two_state_scan(body, ("hn", "gn", "prod", "old", "th"))
    rng = np.random.default_rng(0)
    check(m, {n: rng.standard_normal(s).astype(np.float32) for n, s in (("h0", 3), ("g0", 3), ("X", (7, 3)))},
          scans=2)


def test_coupled_states_are_refused():
    body = [node("Mul", ["g", "h"], ["gh"], name="couple"), node("Add", ["gh", "x"], ["hn"]),
            node("Add", ["g", "x"], ["gn"])]
    expect_error(two_state_scan(body), "Scan node 'pair'", "coupled")


def onnx_node_tests(monkeypatch, op_type):
    """The ``onnx`` package's node test cases of ``op_type``, made by its own exporters (its
    ``collect_testcases`` imports the exporters once per process, so it filters only once)."""
    import importlib  # pylint: disable=import-outside-toplevel
    from onnx.backend.test.case import node as cases  # pylint: disable=import-outside-toplevel
    # (importing the module may run its exporters once, into the package's own lists)
    exporter = getattr(importlib.import_module(f"onnx.backend.test.case.node.{op_type.lower()}"), op_type)
    monkeypatch.setattr(cases, "_NodeTestCases", [])
    monkeypatch.setattr(cases, "_TargetOpType", op_type)
    monkeypatch.setattr(cases, "_existing_names", {})
    for name in dir(exporter):
        if name.startswith("export_"):
            getattr(exporter, name)()
    return list(cases._NodeTestCases)  # pylint: disable=protected-access


def test_onnx_node_test_scans(monkeypatch):
    """The ``onnx`` package's own Scan node tests: opset 8 (a batch axis) and opset 9 (sums,
    several states, scalars)."""
    ran = 0
    for case in onnx_node_tests(monkeypatch, "Scan"):
        inputs, outputs = case.data_sets[0]
        names = [i.name for i in case.model.graph.input]
        check(case.model, dict(zip(names, inputs)), list(outputs))
        ran += 1
    assert ran == 4


def test_onnx_loop11_with_constant_trip_count(monkeypatch):
    """The ``onnx`` package's ``test_loop11`` (``Slice(x, i, i+1)`` of a body Constant, the end
    computed by ``Add``), with its trip count and condition as initializers (an exporter's
    constants), against its expected outputs."""
    case = next(c for c in onnx_node_tests(monkeypatch, "Loop") if c.name == "test_loop11")
    (trip, cond, y), expected = case.data_sets[0]
    m = onnx.ModelProto()
    m.CopyFrom(case.model)
    keep = [i for i in m.graph.input if i.name == m.graph.node[0].input[2]]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    m.graph.initializer.extend([numpy_helper.from_array(trip, m.graph.node[0].input[0]),
                                numpy_helper.from_array(cond, m.graph.node[0].input[1])])
    check(m, {keep[0].name: y}, list(expected), scans=1)


def test_loop_trip_count_from_shape_and_slice_at_iteration():
    """``M = Shape(X)[0]``; ``x_i = Slice(X, i, i+1)`` (axis 0) squeezed; h = a*h + x_i."""
    length = 6
    body = helper.make_graph(
        [node("Unsqueeze", ["i", "zero"], ["start"]), node("Add", ["i", "one"], ["i1"]),
         node("Unsqueeze", ["i1", "zero"], ["end"]), node("Slice", ["X", "start", "end", "zero"], ["xs"], name="step_slice"),
         node("Squeeze", ["xs", "zero"], ["x_i"]), node("Mul", ["h", "a"], ["ah"]), node("Add", ["ah", "x_i"], ["hn"]),
         node("Identity", ["c"], ["c_out"]), node("Identity", ["hn"], ["y"])],
        "body", [vi("i", [], TensorProto.INT64), vi("c", [], TensorProto.BOOL), vi("h", [4])],
        [vi("c_out", [], TensorProto.BOOL), vi("hn", [4]), vi("y", [4])])
    nodes = [node("Shape", ["X"], ["shape"]), node("Gather", ["shape", "zero_s"], ["M"], axis=0),
             helper.make_node("Loop", ["M", "", "h0"], ["h_last", "Y"], name="the_loop", body=body)]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "zero"), numpy_helper.from_array(np.int64(0), "zero_s"),
             numpy_helper.from_array(np.int64(1), "one"),
             numpy_helper.from_array(np.random.default_rng(1).uniform(-1, 1, 4).astype(np.float32), "a")]
    m = model(nodes, [vi("h0", [4]), vi("X", [length, 4])], [vi("h_last", [4]), vi("Y", [length, 4])], inits)
    rng = np.random.default_rng(2)
    check(m, {"h0": rng.standard_normal(4).astype(np.float32), "X": rng.standard_normal((length, 4)).astype(np.float32)},
          scans=1)


def test_loop_early_exit_and_old_state_output():
    body = [node("Mul", ["h", "a_i"], ["ah"]), node("Add", ["b_i", "ah"], ["hn"])]
    m = loop_model(7, body)
    m.graph.node[0].attribute[0].g.node[-2].input[0] = "b_i"  # cond_out = Identity(b_i)
    expect_error(m, "Loop node 'the_loop'", "no early exit")
    m = loop_model(7, body)
    m.graph.node[0].attribute[0].g.node[-1].input[0] = "h"  # collects the old state
    rng = np.random.default_rng(3)
    fs = {"h0": rng.standard_normal(3), "A": rng.uniform(-1, 1, (7, 3)), "B": rng.standard_normal((3, 7))}
    check(m, {k: v.astype(np.float32) for k, v in fs.items()}, scans=1)


def test_loop_runtime_trip_count_and_iteration_arithmetic():
    body = [node("Mul", ["h", "a_i"], ["ah"]), node("Add", ["b_i", "ah"], ["hn"])]
    m = loop_model(7, body)
    del m.graph.initializer[0]  # M becomes a graph input: not a constant trip count
    m.graph.input.append(vi("M", [], TensorProto.INT64))
    expect_error(m, "Loop node 'the_loop'", "trip count")
    m = loop_model(7, body)
    g = m.graph.node[0].attribute[0].g
    g.node[0].input[1] = "i2"  # a_i = A[2 i]: arithmetic on the iteration number
    g.node.insert(0, node("Mul", ["i", "two"], ["i2"], name="twice"))
    m.graph.initializer.append(numpy_helper.from_array(np.array(2, np.int64), "two"))
    expect_error(m, "Loop node 'the_loop'", "'gather_a_i' (Gather)", "iteration number")


def test_bad_files(tmp_path):
    missing = tmp_path / "missing.onnx"
    expect_error(missing, str(missing), "no such")
    good = scan_model(AFFINE_BODIES["h*a+b"], [3], [[7, 3]] * 2).SerializeToString()
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07\xff\xff\xff garbage" + bytes(range(256)))
    expect_error(corrupt, str(corrupt), "corrupt")
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(good[: len(good) // 2])
    err = expect_error(truncated, str(truncated), "truncated")
    assert err.__cause__ is None and err.__suppress_context__  # no protobuf traceback attached
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    expect_error(empty, str(empty), "not a complete ONNX model")


def test_path_input(tmp_path):
    path = tmp_path / "ok.onnx"
    onnx.save(scan_model([node("Add", ["h", "x0_t"], ["hn"])], [3], [[7, 3]]), str(path))
    assert "scanweaver.affine_scan" in from_onnx(path).script()
    assert "scanweaver.affine_scan" in from_onnx(str(path)).script()
    with pytest.raises(UnsupportedRecurrence):
        from_onnx(tmp_path / "nope.onnx")


def scan8_model(seq_lens=None, directions=(1, 0)):
    """Opset-8 Scan, batch 3: h = a_t*h + b_t per batch element, a read backwards."""
    body = helper.make_graph([node("Mul", ["h", "a_t"], ["ah"]), node("Add", ["ah", "b_t"], ["hn"]),
                              node("Identity", ["hn"], ["y"])], "body",
                             [vi("h", [4]), vi("a_t", [4]), vi("b_t", [4])], [vi("hn", [4]), vi("y", [4])])
    scan = helper.make_node("Scan", ["lens" if seq_lens is not None else "", "h0", "A", "B"], ["h_last", "Y"],
                            name="scan8", body=body, num_scan_inputs=2, directions=list(directions))
    inits = [] if seq_lens is None else [numpy_helper.from_array(np.array(seq_lens, np.int64), "lens")]
    graph = helper.make_graph([scan], "g", [vi("h0", [3, 4]), vi("A", [3, 7, 4]), vi("B", [3, 7, 4])],
                              [vi("h_last", [3, 4]), vi("Y", [3, 7, 4])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)])


def test_opset8_scan_with_a_batch_axis():
    rng = np.random.default_rng(8)
    fs = {"h0": rng.standard_normal((3, 4)), "A": rng.uniform(-1, 1, (3, 7, 4)), "B": rng.standard_normal((3, 7, 4))}
    fs = {k: v.astype(np.float32) for k, v in fs.items()}
    check(scan8_model(), fs, scans=3)                       # one scan per batch element
    check(scan8_model(seq_lens=[7, 7, 7]), fs, scans=3)
    expect_error(scan8_model(seq_lens=[7, 5, 7]), "Scan node 'scan8'", "sequence_lens")


def test_symbolic_dims_compile_once():
    """``seq`` and ``batch`` dims stay symbolic: imported at a few sizes, fused, generalized,
    compiled once, equal to ONNX Runtime at sizes never imported (both directions, h0)."""
    body = AFFINE_BODIES["h*a+b"]
    m = scan_model(body, ["batch", 4], [["seq", "batch", 4]] * 2, axes=[0, 0], dirs=[1, 1])
    imported = from_onnx(m)
    assert [[str(getattr(d, "value", d)) for d in p.ty.shape.values] for p in imported["main"].params] == \
        [["batch", "4"], ["seq", "batch", "4"], ["seq", "batch", "4"]]
    vm = relax.VirtualMachine(sw.compile(imported, "llvm"), tvm.cpu())
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch, length in [(1, 1), (3, 2), (1, 100), (2, 1025)]:
        fs = feeds(np.random.default_rng(length), [batch, 4], [[length, batch, 4]] * 2)
        want = sess.run(None, fs)
        got = vm["main"](*[tvm.runtime.tensor(fs[i.name]) for i in m.graph.input])
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-5)


def test_unknown_dims_are_refused_clearly():
    """A dim with neither a size nor a name cannot be traced at chosen sizes."""
    m = scan_model([node("Add", ["h", "x0_t"], ["hn"])], [3], [[None, 3]])
    expect_error(m, "Scan node 'the_scan'", "needs a static shape", "symbolic dims")
