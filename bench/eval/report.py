"""The run's outputs: JSON (every episode and the aggregates) and a markdown table."""
from __future__ import annotations

import json
import os
from typing import Dict, List


def _f(x, fmt="{:.2f}", none="-") -> str:
    return none if x is None else fmt.format(x)


def markdown(meta: dict, metrics: Dict[str, Dict[str, dict]], families: List[str], policies: List[str]) -> str:
    from .families import TUNED_ON
    from .metrics import HELD_OUT

    held = any(HELD_OUT in row for row in metrics.values())
    tuned = [f for f in families if f in TUNED_ON]
    lines = [f"# Evaluation: {meta['model']} ({meta['date']})", "",
             f"{meta['episodes_per_family']} episode(s) per family, window {meta['window']}, "
             f"{meta['duration_s']:.0f} s in all, driven by the environment (scripted tool calls); "
             f"{'quick settings' if meta.get('quick') else 'full settings'}."
             + ((f" Families whose wording heuristics were once tuned on: {', '.join(tuned)}; "
                 f"`{HELD_OUT}` pools the others." if tuned else
                 f" Nothing was tuned on these families; `{HELD_OUT}` pools them.") if held else ""), "",
             "## Accuracy (95% Wilson interval) per family", "",
             "| policy | " + " | ".join(families) + " | all |" + (" held-out |" if held else ""),
             "|---|" + "---|" * (len(families) + 1 + held)]
    for pol in policies:
        row = metrics.get(pol, {})
        cells = []
        for fam in families + ["all"] + ([HELD_OUT] if HELD_OUT in row else []):
            m = row.get(fam)
            cells.append("-" if not m or m["accuracy"] is None else
                         f"{m['accuracy']:.2f} [{m['ci95'][0]:.2f}-{m['ci95'][1]:.2f}]")
        lines.append(f"| {pol} | " + " | ".join(cells) + " |")
    lines += _places(metrics, policies)
    lines += _model_text(metrics, policies)
    lines += ["", "## Cost and compaction (all families)", "",
              "| policy | tokens/episode | prefill | decode | probe | background | wall s/episode | compactions "
              "| at boundary | boundaries compacted (at most) | by trigger | mean fill | summary tok | kept verbatim tok "
              "| fact recall | probe AUC (with result cue) | worst stall ms | history searches (found an answer) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for pol in policies:
        m = metrics.get(pol, {}).get("all")
        if not m:
            continue
        t, e = m["tokens"], max(1, m["episodes"])
        lines.append(
            f"| {pol} | {t['total'] / e:.0f} | {t['prefill'] / e:.0f} | {t['decode'] / e:.0f} | "
            f"{t['probe'] / e:.0f} | {t['background'] / e:.0f} | {_f(m['wall_s_per_episode'], '{:.1f}')} | "
            f"{m['compactions']} | {m['compactions_at_boundary']} | "
            f"{_of(m.get('boundaries_compacted'), m.get('boundaries'))} ({_f(m.get('compactions_boundary_ceiling'), '{}')}) | "
            f"{_triggers(m)} | {_f(m['compaction_fill_mean'])} | "
            f"{_f(m.get('summary_tokens_mean'), '{:.0f}')} | {_f(m.get('kept_tokens_mean'), '{:.0f}')} | "
            f"{_f(m['fact_recall_mean'])} | {_f(m['probe_auc'])} ({_f(m.get('probe_auc_cue'))}) | "
            f"{_f(m['stalls_ms_max'], '{:.0f}')} | "
            f"{m.get('search_calls', 0)} ({m.get('search_found', 0)}) |")
    return "\n".join(lines) + "\n"


def _places(metrics: Dict[str, Dict[str, dict]], policies: List[str]) -> List[str]:
    """Accuracy by where the asked fact lived, on the held-out families (the agent families carry places)."""
    from .metrics import HELD_OUT

    rows = {pol: metrics.get(pol, {}).get(HELD_OUT, {}).get("by_place") or {} for pol in policies}
    places = sorted({p for r in rows.values() for p in r})
    if not places:
        return []
    out = ["", "## Held-out families: accuracy by where the fact lived (correct/asked)", "",
           "| policy | " + " | ".join(places) + " | all held-out |", "|---|" + "---|" * (len(places) + 1)]
    for pol in policies:
        if not rows[pol]:
            continue
        cells = [f"{rows[pol][p]['correct']}/{rows[pol][p]['questions']}" if p in rows[pol] else "-" for p in places]
        m = metrics[pol][HELD_OUT]
        cells.append(f"{m['correct']}/{m['questions']} ({m['accuracy']:.2f})")
        out.append(f"| {pol} | " + " | ".join(cells) + " |")
    return out


def _model_text(metrics: Dict[str, Dict[str, dict]], policies: List[str]) -> List[str]:
    """What the model wrote itself (notes, summaries) and how much of the asked facts it carried."""
    rows = [(pol, metrics[pol]["all"]) for pol in policies if metrics.get(pol, {}).get("all", {}).get("notes")
            or metrics.get(pol, {}).get("all", {}).get("model_summaries")]
    if not rows:
        return []
    out = ["", "## What the model wrote (all families)", "",
           "| policy | notes | on outputs holding an asked fact | of which carried one | note fact recall "
           "| notes skipped | model summaries used | informative | their fact recall | summaries failed |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for pol, m in rows:
        out.append(f"| {pol} | {m['notes']} | {m['notes_on_fact_outputs']} | {m['notes_informative']} | "
                   f"{_f(m['note_fact_recall'])} | {_counted(m['notes_skipped'])} | {m['model_summaries']} | "
                   f"{_f(m['model_summaries_informative'])} | {_f(m['model_text_fact_recall'])} | "
                   f"{_counted(m['model_summaries_failed'])} |")
    return out


def _counted(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "-"


def _of(k, n) -> str:
    return "-" if k is None or n is None else f"{k}/{n}"


def _triggers(m: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in (m.get("compactions_by_trigger") or {}).items()) or "-"


def write_json(path: str, data: dict) -> None:
    """Written whole or not at all (a temporary file renamed over it): a run killed while it writes its
    checkpoint keeps the previous one, which --resume can read."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write(prefix: str, meta: dict, results: List[dict], metrics: dict, families, policies) -> List[str]:
    write_json(prefix + ".json", {"meta": meta, "metrics": metrics, "episodes": results})
    with open(prefix + ".md", "w") as f:
        f.write(markdown(meta, metrics, list(families), list(policies)))
    return [prefix + ".json", prefix + ".md"]
