"""The search evaluation's markdown: best latency per task and method, geometric means,
trials XGBoost needs to match the world model, and held-out ranking quality."""
import math

import numpy as np

METHODS = ("random", "xgb", "world_model")
LABEL = {"random": "random", "xgb": "XGBoost", "world_model": "world model"}


def best_so_far(lat):
    return np.minimum.accumulate(np.asarray(lat, np.float64))


def trials_to_match(xgb_lat, target_secs):
    """1-based index of the first XGBoost trial at least as fast as ``target_secs`` (None: never)."""
    hits = np.nonzero(best_so_far(xgb_lat) <= target_secs)[0]
    return int(hits[0]) + 1 if len(hits) else None


def summarize(result):
    """Per task and method: mean over seeds of the best latency; per method: geomean over tasks
    (tasks where every method has every seed); per task: XGBoost trials to match, per seed."""
    rows, match = {}, {}
    for task, by_method in result["search"].items():
        rows[task] = {m: float(np.mean([min(v) for v in by_method[m].values()]))
                      for m in METHODS if by_method.get(m)}
        if by_method.get("xgb") and by_method.get("world_model"):
            match[task] = {s: trials_to_match(by_method["xgb"][s], min(by_method["world_model"][s]))
                           for s in by_method["world_model"] if s in by_method["xgb"]}
    complete = [t for t, r in rows.items() if all(m in r for m in METHODS)]
    geo = {m: float(math.exp(np.mean([math.log(rows[t][m]) for t in complete]))) if complete else None
           for m in METHODS}
    return rows, geo, match, complete


def _us(x):
    return "-" if x is None else f"{x * 1e6:.1f}"


def write_markdown(result, path):
    rows, geo, match, complete = summarize(result)
    seeds = result.get("seeds")
    out = [f"Search with {result['trials']} measured trials per task, mean over the seeds run "
           f"(of {seeds} planned) of the best latency (us, lower is better); held-out tasks only "
           "(not in the world model's training data).", "",
           "| task | seeds | random | XGBoost | world model | XGBoost trials to match world model (per seed) |",
           "|---|---|---|---|---|---|"]
    for task, r in rows.items():
        m = match.get(task, {})
        n_seeds = min(len(v) for v in result["search"][task].values())
        per_seed = ", ".join(">" + str(result["trials"]) if v is None else str(v) for _, v in sorted(m.items()))
        out.append(f"| {task} | {n_seeds} | " + " | ".join(_us(r.get(k)) for k in METHODS)
                   + f" | {per_seed or '-'} |")
    out.append(f"| **geomean** ({len(complete)} tasks) | | " + " | ".join(_us(geo[k]) for k in METHODS) + " | |")
    out += ["", "Ranking of held-out records (random samples of each task's space) by a model trained "
            "on the other tasks' records: Kendall tau, top-1 (fastest record ranked first), top-5 "
            "recall.", "",
            "| task | n | tau WM | tau XGB | top-1 WM | top-1 XGB | top-5 WM | top-5 XGB |",
            "|---|---|---|---|---|---|---|---|"]
    means = {}
    for task, by_model in result["ranking"].items():
        wm, xg = by_model.get("world_model", {}), by_model.get("xgb", {})
        for key in ("kendall_tau", "top1", "top5_recall"):
            for name, d in (("wm", wm), ("xgb", xg)):
                if key in d:
                    means.setdefault((name, key), []).append(d[key])
        cells = [wm.get("n")] + [d.get(k) for k in ("kendall_tau", "top1", "top5_recall") for d in (wm, xg)]
        out.append(f"| {task} | " + " | ".join("-" if c is None else f"{c:.2f}" if isinstance(c, float)
                                             else str(c) for c in cells) + " |")
    mean_cells = [np.mean(means[(n, k)]) if (n, k) in means else None
                  for k in ("kendall_tau", "top1", "top5_recall") for n in ("wm", "xgb")]
    out.append("| **mean** | | " + " | ".join("-" if c is None else f"{c:.2f}" for c in mean_cells) + " |")
    constant = [f"{LABEL[m]} on {t}" for t, by_model in result["ranking"].items()
                for m, d in by_model.items() if d.get("distinct") == 1]
    if constant:
        out += ["", "Constant predictions (every record scored the same; tau 0, top-k by a seeded "
                "random tie order): " + "; ".join(constant) + "."]
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    return "\n".join(out)
