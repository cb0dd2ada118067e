"""The markdown report of ``bench.models``: tables of times and ratios, where the run time
goes, and the issue's targets at the longest L."""
TOL = 1e-4                      # max relative error of each TVM path against PyTorch
THREADS = 2                     # PyTorch eager and OpenVINO threads (the machine's cores)
# What the issue asks at the longest L: compile >= 10x and run >= 20x faster than TVM without
# the pass, and a faster run than PyTorch eager.
TARGETS = {"compile speedup": 10.0, "run speedup": 20.0, "vs eager": 1.0}
# issue "Real models as users have them": HF Mamba at the real width, at every L measured
MODEL_TARGETS = {"hf_mamba": {"run speedup": 5.0, "vs eager": 3.0, "vs onnxruntime": 1.0}}

def _ms(cell):
    if cell is None:
        return "not run"
    return "fail" if not cell or "run" not in cell else f"{cell['run']['ms']:.3f}"


def _s(cell):
    if cell is None:
        return "not run"
    if not cell or "runnable_s" not in cell:
        return "fail"
    return f"{cell['runnable_s']:.1f} ({cell['compile_s']:.1f} + {cell['load_s']:.1f})"


def _chk(cell):
    if not cell:
        return "—"
    if "rel_err" not in cell:
        return "error"
    return f"{cell['rel_err']:.0e}" + ("" if cell.get("ok", True) else " FAIL")


def _best(r):
    """The best peer's cell: ``eager 301.7`` (the fastest of PyTorch eager with 2 threads and
    OpenVINO, as ``bench.models.best_peer`` picks it)."""
    timed = [(r[k]["run"]["ms"], name) for k, name in (("eager", "eager"), ("openvino", "OpenVINO"))
             if "run" in r.get(k, {}) and r[k].get("ok", True)]
    return "—" if not timed else f"{min(timed)[1]} {min(timed)[0]:.3f}"


def _x(row, key):
    v = row.get("ratios", {}).get(key)
    return "—" if v is None else f"{v:.1f}x"


def report(result):
    m = result["machine"]
    lines = ["# Whole-model benchmark (CPU)", "",
             f"{m['cpu']}, {m['cores']} cores; TVM {m.get('tvm')} (target `{m['target']}`, "
             f"TVM_NUM_THREADS={m['TVM_NUM_THREADS']}), PyTorch {m.get('torch')} eager with "
             f"{THREADS} threads (and 1 thread for reference), no_grad; "
             f"OMP_WAIT_POLICY={m['OMP_WAIT_POLICY']}; OpenVINO {m.get('openvino')} (`ov.convert_model` "
             f"of the same module, CPU plugin, INFERENCE_PRECISION_HINT f32, {THREADS} threads).  "
             "Import = torch.export + Relax frontend, "
             "shared by both TVM paths.  Compile = seconds until the model is runnable: "
             "`tvm.compile` + the LLVM JIT that the first `VirtualMachine` on the executable "
             "runs (TVM makes the machine code lazily), shown as total (compile + JIT).  Run in "
             "ms: every path timed interleaved in the same run (round after round, each path in "
             "turn, a batch of calls >= 1 ms), the median over the rounds.  Check: max "
             f"relative error against PyTorch (must be <= {TOL:.0e}), TVM with the pass / "
             "without / OpenVINO.  Ratios: compile and run "
             "speedup = without pass / with pass (compile: to runnable; `tvm.compile` alone in "
             "parentheses); vs X = X's run time / TVM + pass's; best peer = the faster of "
             "PyTorch eager (2 threads) and OpenVINO.", "",
             "| model | input | import s | compile s (pass) | compile s (no pass) | run ms (pass) "
             "| run ms (no pass) | eager ms (2 thr) | eager ms (1 thr) | OpenVINO ms "
             "| check pass / no pass / OpenVINO | compile speedup | run speedup | vs eager (2 thr) "
             "| vs OpenVINO | best peer ms | vs best peer |",
             "|" + "---|" * 17]
    for r in result["rows"]:
        shape = "x".join(map(str, r["input_shape"][0]))
        if "error" in r:
            lines.append(f"| {r['model']} | {shape} | {r['error']} |" + " |" * 14)
            continue
        lines.append(
            f"| {r['model']} | {shape} | {r['import_s']:.1f} | {_s(r['with'])} | {_s(r.get('without'))} "
            f"| {_ms(r['with'])} | {_ms(r.get('without'))} | {_ms(r.get('eager'))} "
            f"| {_ms(r.get('eager_1t'))} | {_ms(r.get('openvino'))} "
            f"| {_chk(r['with'])} / {_chk(r.get('without'))} / {_chk(r.get('openvino'))} "
            f"| {_x(r, 'compile speedup')} ({_x(r, 'tvm.compile speedup')}) "
            f"| {_x(r, 'run speedup')} | {_x(r, 'vs eager')} | {_x(r, 'vs openvino')} "
            f"| {_best(r)} | {_x(r, 'vs best peer')} |")
    ov = [r for r in result["rows"] if "openvino" in r]
    if ov:
        lines += ["", "## OpenVINO", "",
                  "`ov.convert_model(model, example_input=...)` of the PyTorch module, compiled by "
                  "`ov.Core().compile_model(..., \"CPU\", {INFERENCE_PRECISION_HINT: f32, "
                  f"INFERENCE_NUM_THREADS: {THREADS}, PERFORMANCE_HINT: LATENCY}})`; rounds = "
                  "interleaved timing rounds (calls per round).", "",
                  "| model | L | convert s | compile s | run ms (OpenVINO) | rounds | check "
                  "| run ms (TVM + pass) | pass vs OpenVINO |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in ov:
            o = r["openvino"]
            if "run" not in o:
                lines.append(f"| {r['model']} | {r['L']} | {o.get('error', '?')} | | | | | | |")
                continue
            lines.append(f"| {r['model']} | {r['L']} | {o['convert_s']:.1f} | {o['compile_s']:.1f} "
                         f"| {o['run']['ms']:.3f} | {o['run']['n']} ({o['run']['number']}) "
                         f"| {_chk(o)} | {_ms(r.get('with'))} | {_x(r, 'vs openvino')} |")
    lines += ["", "## Where the run time goes", "",
              "One instrumented call per path records every VM call instruction; each compiled "
              "kernel is then timed on its own (copies of its first call's arguments, so no "
              "hook overhead) and counted calls x time.  Rest = timed run - kernels: the VM's "
              "builtins (allocations, reshape views, tuples) and its dispatch.  Scan share = scan "
              "kernel / timed run of the pass path.  Recurrence speedup (estimate) = (run "
              "without the pass - the pass path's other kernels) / scan kernel: the speedup on "
              "the recurrence alone, if the layers around it cost the same in both graphs.", "",
              "| model | L | pass: VM calls | pass: scan kernel ms | scan share of run "
              "| pass: other kernels ms | pass: rest (VM) ms | pass: biggest other kernels "
              "| no pass: VM calls | no pass: kernels ms | no pass: rest (VM) ms "
              "| recurrence speedup (est.) |",
              "|" + "---|" * 12]
    for r in result["rows"]:
        if "error" in r:
            continue
        p, q = r["with"].get("profile"), r.get("without", {}).get("profile")
        cells = [r["model"], str(r["L"])]
        if p:
            others = [k for k in p["kernels"] if not k["symbol"].startswith("scanweaver")][:3]
            cells += [str(p["calls"]), f"{p['scan_ms']:.3f}",
                      f"{p['scan_ms'] / r['with']['run']['ms']:.0%}", f"{p['kernels_ms']:.3f}",
                      f"{p['rest_ms']:.3f}",
                      ", ".join(f"{k['symbol']} {k['ms']:.3f}" + (f" ({k['calls']}x)" if k["calls"] > 1 else "")
                                for k in others) or "—"]
        else:
            cells += ["—"] * 6
        cells += ([str(q["calls"]), f"{q['kernels_ms'] + q['scan_ms']:.3f}", f"{q['rest_ms']:.3f}"]
                  if q else ["—"] * 3)
        cells.append(f"{(r['without']['run']['ms'] - p['kernels_ms']) / p['scan_ms']:.0f}x"
                     if p and q and p["scan_ms"] > 0 else "—")
        lines.append("| " + " | ".join(cells) + " |")
    ort = [r for r in result["rows"] if "ort" in r]
    if ort:
        lines += ["", "## ONNX Runtime on the exported model", "",
                  "`torch.onnx.export` (TorchScript exporter, opset 17) of the same model, run by "
                  "ONNX Runtime's CPU provider in the same run.", "",
                  "| model | L | export s | run ms (ORT) | check | run ms (TVM + pass) | pass vs ORT |",
                  "|---|---|---|---|---|---|---|"]
        for r in ort:
            o = r["ort"]
            if "run" not in o:
                lines.append(f"| {r['model']} | {r['L']} | {o.get('error', '?')} | | | | |")
                continue
            lines.append(f"| {r['model']} | {r['L']} | {o['export_s']:.1f} | {o['run']['ms']:.3f} "
                         f"| {o['rel_err']:.0e} | {_ms(r['with'])} | {_x(r, 'vs onnxruntime')} |")
    if result.get("targets"):
        lines += ["", "## Targets (at the longest L; HF models at every L)", ""]
        for t in result["targets"]:
            lines.append(f"- {t['model']} L={t['L']}: {t['what']} {t['value']} "
                         f"(target >= {t['target']:g}x): {'met' if t['met'] else 'MISSED'}")
    if result["notes"]:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def _targets(rows):
    longest = max((r["L"] for r in rows), default=None)
    out = []
    for r in rows:
        targets = MODEL_TARGETS.get(r["model"])
        if r["L"] != longest and targets is None:
            continue
        for key, target in (targets or TARGETS).items():
            v = r.get("ratios", {}).get(key)
            out.append({"model": r["model"], "L": r["L"], "what": key, "target": target,
                        "value": None if v is None else f"{v:.2f}x",
                        "met": v is not None and v >= target})
    return out
