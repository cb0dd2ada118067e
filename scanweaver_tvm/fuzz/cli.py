"""Long fuzzing runs: ``python -m bench.fuzz --count 1000 --seed 0 --out bench/out/fuzz``.

Cases run in at most 2 worker processes (this is a shared 2-core machine), each case under a
time limit; progress goes to stdout, one JSON line per case to ``<out>/results.jsonl`` and the
summary to ``<out>/summary.json`` (rewritten as the run goes, so a stopped run has one too).
Failures are saved as reproducers under ``--failures``.
"""
import argparse
import collections
import json
import multiprocessing
import os
import signal
import sys
import time

from .check import OURS, compile_budget

MAX_WORKERS = 2


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=100, help="number of generated models")
    p.add_argument("--seed", type=int, default=0, help="first seed (cases are seed .. seed+count-1)")
    p.add_argument("--out", default="bench/out/fuzz", help="folder for results.jsonl and summary.json")
    p.add_argument("--failures", default="fuzz-failures", help="folder for failing cases (reproducers)")
    p.add_argument("--budget", type=float, default=None, help="stop starting cases after this many seconds")
    p.add_argument("--workers", type=int, default=MAX_WORKERS, help=f"worker processes (at most {MAX_WORKERS})")
    p.add_argument("--max-length", type=int, default=512, help="largest L drawn")
    p.add_argument("--case-timeout", type=int, default=900, help="seconds before a case counts as hung")
    args = p.parse_args(argv)
    if not 1 <= args.workers <= MAX_WORKERS:
        p.error(f"--workers must be between 1 and {MAX_WORKERS}")
    if args.count < 1 or args.max_length < 1:
        p.error("--count and --max-length must be positive")
    return args


class _Timeout(Exception):
    pass


def _alarm(_sig, _frame):
    raise _Timeout("case timed out")


def _init_worker():
    os.environ.setdefault("TVM_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    signal.signal(signal.SIGALRM, _alarm)


def _work(job):
    """One case in a worker: generate, check, save on failure; a dict for results.jsonl."""
    seed, max_length, failures, deadline, timeout = job
    if deadline is not None and time.time() > deadline:
        return {"seed": seed, "status": "skipped"}
    from .check import Result, check_case, save_failure
    from .generate import generate_case

    case = generate_case(seed, max_length=max_length)
    signal.alarm(timeout)
    try:
        res = check_case(case, failures)
    except _Timeout:
        res = Result(seed, tags=list(case.tags), seconds=float(timeout))
        res.add("crash", "timeout", f"no verdict after {timeout} s")
        res.finish()
        res.saved = save_failure(case.source, res, failures)
    finally:
        signal.alarm(0)
    out = res.as_dict()
    out.pop("detail")
    out["expect"] = case.expect
    return out


def summarize(rows, elapsed, args):
    """The JSON summary: counts by status, by generated feature, near misses left alone."""
    done = [r for r in rows if r["status"] != "skipped"]
    status = collections.Counter(r["status"] for r in done)
    forms = collections.Counter(t for r in done for t in r["tags"])
    found = collections.Counter(e[0] for r in done for e in r["expect"]["found"])
    by = lambda *kinds: sorted(r["seed"] for r in done if r["status"] in kinds)  # noqa: E731
    return {
        "count": len(done), "skipped": len(rows) - len(done), "seeds": [args.seed, args.seed + args.count - 1],
        "max_length": args.max_length, "status": dict(status),
        "ours": {"mismatch": by("mismatch"), "crash": by("crash"), "detection": by("detection"),
                 "slow_compile": by("slow_compile")},
        "compile_unfused": _worst_compile(done),
        "tvm": {"crash": by("tvm_crash"), "mismatch": by("tvm_mismatch")},
        "invalid_cases": by("invalid"),
        "recurrences_expected": dict(found),
        "near_misses_left_alone": sum(len(r["expect"]["rejected"]) for r in done if r["status"] == "ok"),
        "unchanged_modules_verified": sum(r["expect"]["unchanged"] for r in done if r["status"] == "ok"),
        "per_form": dict(sorted(forms.items())),
        "max_error": {k: max((r["errors"].get(k, 0.0) for r in done), default=0.0) for k in ("pass", "base", "torch")},
        "seconds": {"elapsed": round(elapsed, 1), "cases": round(sum(r["seconds"] for r in done), 1),
                    "slowest": max((r["seconds"] for r in done), default=0.0)},
    }


def _worst_compile(done):
    """Over the cases where nothing was fused: the worst ``sw.compile`` / ``tvm.compile`` time
    ratio and excess over ``compile_budget``, with their seeds."""
    unfused = [r for r in done if not r["expect"]["found"] and {"base", "pass"} <= set(r["compile_s"])]
    if not unfused:
        return {"cases": 0}
    ratio = max(unfused, key=lambda r: r["compile_s"]["pass"] / max(r["compile_s"]["base"], 1e-3))
    excess = max(unfused, key=lambda r: r["compile_s"]["pass"] - compile_budget(r["compile_s"]["base"]))
    return {"cases": len(unfused),
            "worst_ratio": round(ratio["compile_s"]["pass"] / max(ratio["compile_s"]["base"], 1e-3), 2),
            "worst_ratio_seed": ratio["seed"], "worst_ratio_seconds": ratio["compile_s"],
            "worst_excess_s": round(excess["compile_s"]["pass"] - compile_budget(excess["compile_s"]["base"]), 2),
            "worst_excess_seed": excess["seed"]}


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    deadline = None if args.budget is None else start + args.budget
    jobs = [(s, args.max_length, args.failures, deadline, args.case_timeout)
            for s in range(args.seed, args.seed + args.count)]
    rows, last_print = [], 0.0
    results = open(os.path.join(args.out, "results.jsonl"), "w")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(args.workers, initializer=_init_worker, maxtasksperchild=50) as pool:
        for row in pool.imap_unordered(_work, jobs):
            rows.append(row)
            if row["status"] == "skipped":
                continue
            results.write(json.dumps(row) + "\n")
            results.flush()
            bad = [r for r in rows if r["status"] not in ("ok", "skipped")]
            if row["status"] != "ok":
                print(f"  seed {row['seed']}: {row['status']} {row['problems'][0][2][:160]} -> {row.get('saved')}")
            now = time.time()
            if now - last_print > 10 or len(rows) == len(jobs) or row["status"] != "ok":
                ours = sum(r["status"] in OURS for r in bad)
                print(f"done {len(rows)}/{len(jobs)}  failures {len(bad)} (ours {ours}, "
                      f"tvm {sum(r['status'].startswith('tvm') for r in bad)})  elapsed {now - start:.0f}s", flush=True)
                last_print = now
                _write_summary(rows, now - start, args)
    results.close()
    summary = _write_summary(rows, time.time() - start, args)
    print(json.dumps({k: summary[k] for k in ("count", "status", "ours", "tvm", "near_misses_left_alone",
                                              "compile_unfused")}))
    return 0 if summary["status"].get("ok", 0) == summary["count"] else 1


def _write_summary(rows, elapsed, args):
    summary = summarize(rows, elapsed, args)
    path = os.path.join(args.out, "summary.json")
    with open(path + ".tmp", "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(path + ".tmp", path)
    return summary
