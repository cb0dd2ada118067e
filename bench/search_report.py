"""The search evaluation's report: ``report.md`` (tables) and ``curves.svg`` (best-so-far curves).

Per task, budget and cost model: the geometric mean over seeds of the best schedule's latency,
re-timed interleaved (``retime.json``; the search-time median where a schedule was not
re-timed, and the report says how many).  Ratios are XGBoost / world model: above 1, the
world model's schedules are faster.  The curves are drawn here as plain SVG (no plotting
package): per cost model, the geometric mean over tasks and seeds of the best latency so
far, divided by the best any run found for the task.
"""
import json
import math
import os

import numpy as np

LABEL = {"xgb": "XGBoost", "world": "world model"}
COLOUR = {"xgb": "#1f77b4", "world": "#d62728"}


def _geomean(xs):
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    return math.exp(float(np.mean([math.log(x) for x in xs]))) if xs else None


def _best(runs, retimed, task, method, budget):
    """Per seed, the best latency at ``budget`` (re-timed when there is a re-timing); and how
    many came from the search's own timing."""
    values, untimed = [], 0
    for key, run in runs.items():
        name, m, _ = key.split("|")
        if name != task or m != method or str(budget) not in run["best"]:
            continue
        timed = retimed.get(f"{key}|{budget}")
        if timed is None:
            untimed += 1
        values.append(timed if timed is not None else run["best"][str(budget)]["secs"])
    return values, untimed


def summarize(runs, retimed, methods, budgets, tasks):
    """``{task: {budget: {method: geomean over seeds}}}``, the seeds counted, and the untimed."""
    table, seeds, untimed = {}, {}, 0
    for task in tasks:
        for budget in budgets:
            for method in methods:
                values, n_untimed = _best(runs, retimed, task, method, budget)
                untimed += n_untimed
                table.setdefault(task, {}).setdefault(budget, {})[method] = _geomean(values)
                seeds[(task, method)] = max(seeds.get((task, method), 0), len(values))
    return table, seeds, untimed


def ratios(table, budgets):
    """Geometric mean over tasks of XGBoost / world model per budget, and world-16 vs XGBoost-64."""
    out = {}
    for budget in budgets:
        pairs = [r[budget] for r in table.values() if r[budget].get("xgb") and r[budget].get("world")]
        out[str(budget)] = (_geomean([p["xgb"] / p["world"] for p in pairs]), len(pairs))
    lo, hi = min(budgets), sorted(budgets)[len(budgets) // 2]
    pairs = [r for r in table.values() if r[hi].get("xgb") and r[lo].get("world")]
    out[f"world{lo}_vs_xgb{hi}"] = (_geomean([r[hi]["xgb"] / r[lo]["world"] for r in pairs]), len(pairs))
    return out


def curves(runs, methods, tasks):
    """Per method: geomean over (task, seed) of best-so-far / the task's best, per trial."""
    best = {t: min((min(r["lat"]) for k, r in runs.items() if k.split("|")[0] == t), default=None) for t in tasks}
    out = {}
    for method in methods:
        rows = [np.minimum.accumulate(np.asarray(r["lat"], np.float64)) / best[k.split("|")[0]]
                for k, r in runs.items() if k.split("|")[1] == method and best.get(k.split("|")[0])]
        if rows:
            n = min(len(r) for r in rows)
            out[method] = np.exp(np.mean(np.log(np.stack([r[:n] for r in rows])), axis=0))
    return out


def write_svg(path, curve, budgets):
    """Best-so-far curves, log-scaled trial axis, with the budgets marked."""
    width, height, left, bottom, top, right = 640, 400, 60, 50, 20, 20
    n = max(len(c) for c in curve.values())
    ymax = max(float(c[0]) for c in curve.values())
    ymax = max(1.05, min(ymax, 4.0))

    def x(i):
        return left + (width - left - right) * math.log(i) / math.log(n)

    def y(v):
        return top + (height - top - bottom) * (ymax - min(v, ymax)) / (ymax - 1.0)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             'font-size="12">', f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="black"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="black"/>']
    for b in budgets:
        if b <= n:
            parts.append(f'<line x1="{x(b):.1f}" y1="{top}" x2="{x(b):.1f}" y2="{height - bottom}" stroke="#bbb" '
                         'stroke-dasharray="4"/>')
            parts.append(f'<text x="{x(b):.1f}" y="{height - bottom + 16}" text-anchor="middle">{b}</text>')
    for v in np.linspace(1.0, ymax, 5):
        parts.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    for k, (method, c) in enumerate(curve.items()):
        points = " ".join(f"{x(i + 1):.1f},{y(float(v)):.1f}" for i, v in enumerate(c))
        parts.append(f'<polyline fill="none" stroke="{COLOUR.get(method, "black")}" stroke-width="2" points="{points}"/>')
        parts.append(f'<text x="{width - right - 150}" y="{top + 16 + 16 * k}" fill="{COLOUR.get(method, "black")}">'
                     f'{LABEL.get(method, method)}</text>')
    parts.append(f'<text x="{(left + width) / 2}" y="{height - 10}" text-anchor="middle">measured trials (log scale)</text>')
    parts.append(f'<text x="14" y="{(top + height) / 2}" transform="rotate(-90 14 {(top + height) / 2})" '
                 'text-anchor="middle">best latency so far / best found (geomean)</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def _us(x):
    return "-" if x is None else f"{x * 1e6:.1f}"


def _ranking_lines(ranking):
    if not ranking:
        return []
    out = ["", f"Ranking of the held-out tasks' records ({ranking['heldout_records']}) by models trained on "
           f"the {ranking['train_tasks']} training tasks' {ranking['train_records']} records "
           "(Kendall tau, fastest record ranked first, top-5 recall; means over tasks):", "",
           "| model | tau | top-1 | top-5 recall |", "|---|---|---|---|"]
    for method, q in ranking["mean"].items():
        out.append(f"| {LABEL[method]} | {q['kendall_tau']:.2f} | {q['top1']:.2f} | {q['top5_recall']:.2f} |")
    out += ["", "Learning curve of the world model (pretrained on part of each training task's records):", "",
            "| training records | tau | top-1 | top-5 recall |", "|---|---|---|---|"]
    for _, c in sorted(ranking["curve"].items(), key=lambda kv: float(kv[0])):
        out.append(f"| {c['records']} | {c['kendall_tau']:.2f} | {c['top1']:.2f} | {c['top5_recall']:.2f} |")
    return out


def write_report(out_dir, runs, methods, budgets, tasks):
    """Write ``report.md`` and ``curves.svg`` into ``out_dir``; returns the markdown."""
    def load(name):
        path = os.path.join(out_dir, name)
        if not os.path.exists(path):
            return {}
        with open(path) as f:
            return json.load(f)
    retimed, ranking = load("retime.json"), load("ranking.json")
    table, seeds, untimed = summarize(runs, retimed, methods, budgets, tasks)
    rat = ratios(table, budgets)
    head = " | ".join(f"{LABEL[m]} @{b}" for b in budgets for m in methods)
    out = [f"Best latency (us, geometric mean over seeds; re-timed interleaved"
           + (f", {untimed} of them not re-timed" if untimed else "") + ") per held-out task and budget.", "",
           f"| task | seeds | {head} |", "|---|---|" + "---|" * (len(budgets) * len(methods))]
    for task in tasks:
        n = min(seeds[(task, m)] for m in methods)
        out.append(f"| {task} | {n} | " + " | ".join(_us(table[task][b][m]) for b in budgets for m in methods) + " |")
    out += ["", "| XGBoost / world model (geomean over tasks) | " + " | ".join(f"@{b}" for b in budgets)
            + f" | world @{min(budgets)} vs XGBoost @{sorted(budgets)[len(budgets) // 2]} |",
            "|---|" + "---|" * (len(budgets) + 1)]
    cells = [rat[str(b)] for b in budgets] + [rat[f"world{min(budgets)}_vs_xgb{sorted(budgets)[len(budgets) // 2]}"]]
    out.append("| ratio (tasks) | " + " | ".join("-" if r is None else f"{r:.3f}x ({k})" for r, k in cells) + " |")
    out += _ranking_lines(ranking)
    curve = curves(runs, methods, tasks)
    if curve:
        write_svg(os.path.join(out_dir, "curves.svg"), curve, budgets)
        out += ["", "![best-so-far curves](curves.svg)"]
    text = "\n".join(out) + "\n"
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(text)
    return text
