"""The documentation site's benchmark pages, generated at build time (mkdocs-gen-files).

One page per benchmark, ``benchmarks/<name>.md``, from what the benchmarks recorded in
``benchmarks/results``: the JSON lines each benchmark script appends (``*.jsonl``), the JSON and
PNG files of the load-step and long-run benchmarks, and ``run_metadata.jsonl``, which supplies
the date, commit, machine and command of records that were written without them (transcribed
from the README of the time; a record's own fields always win). Each page starts with a short
hand-written text, ``docs/benchmarks/_intro/<name>.md`` (what the benchmark measures and how to
read it: no figures there), followed by the runs: the newest first, each with its command,
date, commit and machine, and its figures as tables rendered from the records.

Every measured figure of the site is on these pages; the other pages link here. Adding a run is
running the benchmark (it appends its JSON lines); the page follows at the next build.

Run by ``mkdocs build`` through the ``gen-files`` plugin (``mkdocs.yml``); by hand, ``python
docs/gen/benchmarks.py OUT_DIR`` writes the pages under ``OUT_DIR`` without mkdocs, and
``--check`` prints their sizes.
"""
from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
INTRO = ROOT / "docs" / "benchmarks" / "_intro"
METADATA = RESULTS / "run_metadata.jsonl"
TRANSCRIBED = "transcribed from README"


# --- records -------------------------------------------------------------------------------

def _metadata() -> list[dict]:
    if not METADATA.exists():
        return []
    return [json.loads(line) for line in METADATA.read_text().splitlines() if line.strip()]


META = _metadata()


def _applies(meta: dict, file: str, line: int, record: dict) -> bool:
    if meta["file"] not in ("*", file):
        return False
    if "lines" in meta and not meta["lines"][0] <= line <= meta["lines"][1]:
        return False
    if "match" in meta and any(record.get(k) != v for k, v in meta["match"].items()):
        return False
    return True


def _with_metadata(file: str, line: int, record: dict) -> dict:
    """The record with the fields it lacks taken from run_metadata.jsonl: the most specific
    entry first (a match, then a line range, then the file, then every file)."""
    out = dict(record)
    entries = [m for m in META if _applies(m, file, line, record)]
    entries.sort(key=lambda m: ("match" in m) * 4 + ("lines" in m) * 2 + (m["file"] != "*"), reverse=True)
    for m in entries:
        for k, v in m.items():
            if k in ("file", "lines", "match", "source", "note_on_fields"):
                continue
            if k not in out:
                out[k] = v
                if k in ("date", "commit", "command") and m.get("source"):
                    out.setdefault("_transcribed", set()).add(k)
    out["_line"] = line
    return out


def load(name: str) -> list[dict]:
    path = RESULTS / name
    if not path.exists():
        return []
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            out.append(_with_metadata(name, i, json.loads(line)))
    return out


def load_json(name: str) -> dict | None:
    path = RESULTS / name
    if not path.exists():
        return None
    return _with_metadata(name, 0, json.loads(path.read_text()))


def is_summary(r: dict) -> bool:
    return "summary" in r or "rerun" in r


def get(r: dict, path: str, default=None):
    cur = r
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return default
        cur = cur[part]
    return cur


# --- formatting ----------------------------------------------------------------------------

def num(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == 0:
            return "0"
        a = abs(v)
        if a >= 1000:
            return f"{v:,.1f}".removesuffix(".0")
        if a >= 0.001:
            return f"{v:.3f}".rstrip("0").rstrip(".")
        return f"{v:.2g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(num(x) for x in v) if v else "—"
    if isinstance(v, dict):
        return "; ".join(f"{k}: {num(x)}" for k, x in v.items()) if v else "—"
    return str(v)


def cell(v) -> str:
    return num(v).replace("|", "\\|").replace("\n", " ")


def span(lo, hi) -> str:
    if lo is None and hi is None:
        return "—"
    if lo == hi or hi is None:
        return num(lo)
    return f"{num(lo)}–{num(hi)}"


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


@dataclass
class Col:
    header: str
    value: Callable[[dict], object] | str

    def of(self, r: dict):
        return get(r, self.value) if isinstance(self.value, str) else self.value(r)


def table(cols: list[Col], rows: list[dict]) -> str:
    head = "| " + " | ".join(c.header for c in cols) + " |"
    sep = "|" + "|".join("---" for _ in cols) + "|"
    body = ["| " + " | ".join(cell(c.of(r)) for c in cols) + " |" for r in rows]
    return "\n".join([head, sep, *body]) + "\n"


def kv_table(pairs: list[tuple[str, object]], headers=("figure", "value")) -> str:
    head = f"| {headers[0]} | {headers[1]} |\n|---|---|\n"
    return head + "".join(f"| {cell(k)} | {cell(v)} |\n" for k, v in pairs)


def indent(text: str, n: int = 4) -> str:
    return "\n".join((" " * n + line) if line.strip() else "" for line in text.splitlines()) + "\n"


def run_header(r: dict, command: str | None = None, level: str = "###", title: str | None = None) -> str:
    """The run's date, commit, machine and command (from the record, else run_metadata)."""
    date, commit = r.get("date") or "not recorded", r.get("commit") or "not recorded"
    out = [f"{level} {title or f'Run of {date}'}\n"] if level else []
    out.append(f"- **Date:** {date}")
    out.append(f"- **Commit:** `{commit}`" if r.get("commit") else "- **Commit:** not recorded")
    out.append(f"- **Machine:** {r.get('machine', 'not recorded')}")
    cmd = command or r.get("command")
    if cmd:
        out.append(f"- **Command:** `.venv/bin/python {cmd}`" if cmd.startswith("benchmarks/")
                   else f"- **Command:** `{cmd}`")
    if r.get("note"):
        out.append(f"- **Note:** {r['note']}")
    t = sorted(r.get("_transcribed", ()))
    if t:
        out.append(f"- *{', '.join(t)} transcribed from the README of the time (not in the JSON lines)*")
    return "\n".join(out) + "\n\n"


@dataclass
class Run:
    records: list[dict]
    first: dict = field(init=False)

    def __post_init__(self):
        self.first = self.records[0]


def group(records: list[dict], key: Callable[[dict], object]) -> list[Run]:
    """Runs in the order they were recorded (first line first)."""
    groups: dict = {}
    for r in records:
        groups.setdefault(key(r), []).append(r)
    return [Run(rs) for rs in groups.values()]


def runs_newest_first(runs: list[Run], render: Callable[[Run], str], title: Callable[[Run], str],
                      command: Callable[[Run], str | None] = lambda run: None, level: int = 2) -> str:
    """The newest run open, the earlier ones folded (newest first); headings at ``level``."""
    if not runs:
        return "No run recorded yet.\n"
    runs = list(reversed(runs))
    h = "#" * level
    out = [f"{h} Latest run\n\n", run_header(runs[0].first, command(runs[0]), level=h + "#", title=title(runs[0])),
           render(runs[0]), "\n"]
    if len(runs) > 1:
        out.append(f"{h} Earlier runs\n\n")
        for run in runs[1:]:
            body = run_header(run.first, command(run), level="") + render(run)
            out.append(f'??? note "{title(run)}"\n\n' + indent(body) + "\n")
    return "".join(out)


def sources_line(*files: str) -> str:
    present = [f for f in files if (RESULTS / f).exists()]
    return "Results: " + ", ".join(f"`benchmarks/results/{f}`" for f in present) + ".\n\n"


def title_of(run: Run) -> str:
    r = run.first
    return f"{r.get('date') or 'date not recorded'}, commit {r.get('commit') or 'not recorded'}"


# --- the benchmarks ------------------------------------------------------------------------

def refresh_vs_full() -> str:
    recs = [r for r in load("refresh_vs_full.jsonl") if not is_summary(r)]
    cols = [Col("SF", "sf"), Col("model", "model"), Col("source rows changed", "source_rows_changed"),
            Col("incremental run s", "incremental_s"), Col("dbt `table` s", "table_model_s"),
            Col("dbt `incremental` (merge) s", "merge_model_s"), Col("`--full-refresh` s", "full_refresh_s"),
            Col("table / incremental", "ratio_table_to_incremental"),
            Col("`--full-refresh` / table",
                lambda r: num(round(r["full_refresh_s"] / r["table_model_s"], 2))
                if r.get("full_refresh_s") and r.get("table_model_s") else num(None)),
            Col("`--full-refresh` / table, median of pairs",
                lambda r: f"{num(r['ratio_full_refresh_to_table_median'])} ({len(r['rebuild_pairs_s'])} pairs)"
                if r.get("ratio_full_refresh_to_table_median") and len(r.get("rebuild_pairs_s") or []) > 1
                else num(None)),
            Col("merge / incremental", "ratio_merge_to_incremental"), Col("merge rows wrong", "merge_rows_wrong"),
            Col("Spark jobs a batch", "spark_jobs_per_batch"),
            Col("delta queries local / Spark",
                lambda r: f"{num(get(r, 'delta_queries.local'))} / {num(get(r, 'delta_queries.spark'))}"),
            Col("state rows read", "state_rows_read"), Col("target rows rewritten", "target_rows_rewritten"),
            Col("each round's run s",
                lambda r: ", ".join(num(x) for x in r.get("rounds_incremental_s") or []) or num(None)),
            Col("table / mean of rounds", "rounds_ratio_table_to_mean"),
            Col("small batch s (median)", "small_batch_s_median"),
            Col("small batch, whole run s", "small_batch_run_s_median"),
            Col("driver Python / JVM peak MB (incremental)",
                lambda r: f"{num(get(r, 'peak_rss_mb.incremental.python'))} / "
                          f"{num(get(r, 'peak_rss_mb.incremental.jvm'))}"),
            Col("verified", lambda r: bool(r.get("verified")) and r.get("small_batches_verified", True) is not False)]
    phases = [Col("SF", "sf"), Col("model", "model"), Col("batch s", "incremental_batch_s"),
              Col("read s", "phases.read"), Col("evaluate s", "phases.evaluate"),
              Col("commit state s", "phases.commit_state"), Col("commit target s", "phases.commit_target"),
              Col("initial build s", "initial_build_s")]
    runs = group(recs, lambda r: (r.get("date"), r.get("commit"), r.get("command"), r.get("note")))
    newest: dict = {}
    for r in recs:
        if r.get("data_cache_mb") != 0:   # (a run without this machine's kept files is a comparison)
            newest[(r.get("sf"), r.get("model"), bool(r.get("fresh")))] = r
    out = sources_line("refresh_vs_full.jsonl")
    out += ("## The newest figures of each model and scale factor\n\nEach row from the newest run that "
            "measured it, in one process and with each incremental run as a new process (`--fresh`, as "
            "`dbt run`); its run (command, machine) below.\n\n")
    out += table([Col("date", "date"), Col("commit", "commit"),
                  Col("each run a new process", lambda r: "yes" if r.get("fresh") else "no")] + cols,
                 sorted(newest.values(), key=lambda r: (r["sf"], r["model"], bool(r.get("fresh")))))
    out += "\n## Runs, newest first\n\n" + runs_newest_first(
        runs, lambda run: table(cols, run.records) + "\nThe incremental run's batch, by phase:\n\n" +
        table(phases, run.records), title_of, level=3)
    return out


def no_cdf_batch() -> str:
    recs = load("no_cdf_batch.jsonl")
    rows = [r for r in recs if not is_summary(r)]
    cols = [Col("model", "model"), Col("source layout", "layout"), Col("with the feed: s (median)", "cdf_median_s"),
            Col("without: s (median)", "no_cdf_median_s"), Col("without / with", "ratio_no_cdf_to_cdf"),
            Col("source rows changed, each round", "no_cdf_changes_read"), Col("verified", "verified")]
    return sources_line("no_cdf_batch.jsonl") + runs_newest_first(
        group(rows, lambda r: (r.get("date"), r.get("commit"))), lambda run: table(cols, run.records), title_of)


def tpch_models() -> str:
    recs = load("tpch_models.jsonl")
    rows = [r for r in recs if not is_summary(r)]
    summaries = [r for r in recs if is_summary(r)]
    cols = [Col("query", "model"), Col("incremental run s (median of rounds)", "incremental_s"),
            Col("each round's run s", "incremental_runs_s"), Col("dbt `table` s (median)", "table_model_s"),
            Col("table / incremental", "ratio_table_to_incremental"),
            Col("source rows changed", "source_rows_changed"), Col("state rows read", "state_rows_read"),
            Col("rows recomputed", "rows_recomputed"),
            Col("delta queries local / Spark",
                lambda r: f"{num(get(r, 'delta_queries.local'))} / {num(get(r, 'delta_queries.spark'))}"),
            Col("Spark jobs a batch", "spark_jobs_per_batch"), Col("verified", "verified")]

    def render(run: Run) -> str:
        out = ""
        for s in [x for x in summaries if x.get("date") == run.first.get("date")]:
            sm = s["summary"]
            ratios = list(sm.get("ratios", {}).values())
            out += kv_table([("queries", sm.get("queries")),
                             ("verified against batch evaluation", sm.get("verified")),
                             ("table / incremental: median", median(ratios)),
                             ("table / incremental: lowest – highest",
                              span(min(ratios), max(ratios)) if ratios else None),
                             (f"below {num(sm.get('target_ratio'))}x", sm.get("below_target"))]) + "\n"
        return out + table(cols, run.records)
    return sources_line("tpch_models.jsonl") + runs_newest_first(
        group(rows, lambda r: (r.get("date"), r.get("commit"))), render, title_of)


def tpcds_coverage() -> str:
    recs = load("tpcds_coverage.jsonl")
    runs = group(recs, lambda r: r.get("command"))
    cols = [Col("query", "query"), Col("compiles", "compiled"), Col("incremental operators", "incremental_ops"),
            Col("recompute operators", "recompute_ops"), Col("rounds", "rounds"),
            Col("every version exact (Spark and DuckDB)", "exact"), Col("seconds", "seconds"),
            Col("rows at the last version", "rows"),
            Col("error", lambda r: (r.get("error") or "").split("\n")[0][:160] or None)]

    def render(run: Run) -> str:
        out = ""
        for s in [r for r in run.records if "summary" in r]:
            sm = s["summary"]
            out += kv_table([("scale factor", sm.get("sf")), ("fact rows kept: one in", sm.get("sample")),
                             ("refresh rounds", sm.get("rounds")), ("statements", sm.get("queries")),
                             ("compile as written", sm.get("compiled")), ("every version exact", sm.get("exact")),
                             ("with a recompute operator", len(sm.get("with_recompute") or [])),
                             ("not incremental in some round", len(sm.get("not_incremental") or [])),
                             ("not exact", ", ".join(sm.get("not_exact") or {}) or None),
                             ("seconds, whole run", sm.get("seconds"))]) + "\n"
        for r in run.records:
            if "rerun" in r:
                out += f"*{r['rerun']}.*\n\n"
        queries = [r for r in run.records if "query" in r]
        ops = [r["incremental_ops"] + r["recompute_ops"] for r in queries if r.get("compiled")]
        if ops:
            out += (f"Operators per plan: {num(min(ops))} to {num(max(ops))} (median {num(median(ops))}); "
                    f"seconds per statement (build, rounds, batch evaluations): median "
                    f"{num(median([r.get('seconds') for r in queries]))}, "
                    f"most {num(max(r.get('seconds') or 0 for r in queries))}; "
                    f"statements whose last version is empty: {sum(1 for r in queries if r.get('rows') == 0)}.\n\n")
        return out + table(cols, sorted(queries, key=lambda r: r["query"]))
    full = [run for run in runs if "--queries" not in (run.first.get("command") or "")]
    reruns = [run for run in runs if run not in full]
    out = sources_line("tpcds_coverage.jsonl") + runs_newest_first(full, render, title_of)
    if reruns:
        out += "\n## Reruns of single queries\n\n"
        for run in reversed(reruns):
            out += run_header(run.first, level="###", title=title_of(run)) + render(run) + "\n"
    return out


def small_batch_profile() -> str:
    recs = load("small_batch_profile.jsonl")
    cols = [Col("model", "model"), Col("run s (median)", "run_s_median"), Col("batch s (median)", "batch_s_median"),
            Col("read s", "phases_median.read"), Col("evaluate s", "phases_median.evaluate"),
            Col("commit state s", "phases_median.commit_state"), Col("commit target s", "phases_median.commit_target"),
            Col("Spark jobs a batch",
                lambda r: max(r["spark_jobs_per_batch"]) if r.get("spark_jobs_per_batch") else None),
            Col("source changes read",
                lambda r: span(min(r["changes_read"]), max(r["changes_read"])) if r.get("changes_read") else None),
            Col("DuckDB's full recompute s (median)", "duckdb_recompute_s_median")]
    runs = group(recs, lambda r: (r.get("date"), r.get("commit"), r.get("note"), r.get("profiled")))

    def command(run: Run) -> str:
        r = run.first
        return (f"benchmarks/small_batch_profile.py --sf {num(r.get('sf'))} --batches {r.get('runs')}"
                + ("" if r.get("profiled") else " --no-profile"))
    return sources_line("small_batch_profile.jsonl") + runs_newest_first(
        runs, lambda run: table(cols, run.records), title_of, command)


def compile_time() -> str:
    recs = load("compile_time.jsonl")

    def render(run: Run) -> str:
        out = ""
        for s in [r for r in run.records if r.get("summary")]:
            out += table([Col("queries", "queries"), Col("errors", "errors"), Col("compile s (total)", "compile_s"),
                          Col("typing s (total)", "typing_s"), Col("Spark's analysis s (total)", "analysis_s"),
                          Col("(compile + typing) / analysis, median", "median_ratio")], [s])
            out += "\nThe slowest: " + ", ".join(f"{q} {num(v)} s" for q, v in s.get("slowest", {}).items()) + ".\n\n"
        rows = [r for r in run.records if not r.get("summary")]
        out += table([Col("query", "query"), Col("plan nodes", "nodes"), Col("compile s", "compile_s"),
                      Col("typing s", "typing_s"), Col("Spark's analysis s", "analysis_s"),
                      Col("(compile + typing) / analysis", "ratio"), Col("error", "error")], rows)
        return out
    return sources_line("compile_time.jsonl") + runs_newest_first(
        group(recs, lambda r: (r.get("date"), r.get("commit"), r.get("note"))), render, title_of,
        lambda run: "benchmarks/compile_time.py")


def dbt_run_start() -> str:
    recs = load("dbt_run_start.jsonl")
    summaries = [r for r in recs if r.get("summary")]
    runs_ = [r for r in recs if not r.get("summary")]

    def args(r: dict) -> str:
        a = f"benchmarks/dbt_run_start.py --sf {num(r.get('sf', 0.01))} --runs {r.get('runs', '?')}"
        if r.get("command") == "test":
            a += " --command test"
        if r.get("target") == "warm":
            a += " --target warm"
        for c in r.get("confs") or []:
            a += f" --conf {c}"
        return a
    cols = [Col("date", "date"), Col("commit", "commit"), Col("dbt command", lambda r: r.get("command") or "run"),
            Col("target", lambda r: r.get("target") or "local"),
            Col("confs", lambda r: r.get("confs") or r.get("bytecode")), Col("runs", "runs"),
            Col("whole run s: median", "wall_s_median"), Col("mean", "wall_s_mean"),
            Col("lowest – highest", lambda r: span(r.get("min"), r.get("max")) if "min" in r else None),
            Col("interpreter and imports s", "start_s_median"), Col("dbt's parse s", "parse_s_median"),
            Col("session and relation cache s", "session_s_median"), Col("models s", "models_s_median"),
            Col("after the last model s", "end_s_median"), Col("note", "note")]
    detail = [Col("run", "run"), Col("whole run s", "wall_s"), Col("interpreter and imports s", "start_s"),
              Col("dbt's parse s", "parse_s"), Col("session and relation cache s", "session_s"),
              Col("models s", "models_s"), Col("after the last model s", "end_s"), Col("each model s", "models")]
    out = sources_line("dbt_run_start.jsonl")
    out += "## Every run, newest first\n\nOne row per series (its medians); the machine field and commands below.\n\n"
    out += table(cols, list(reversed(summaries)))
    out += "\n## Each series' runs\n\n"
    series = group(runs_, lambda r: (r.get("date"), r.get("commit"), r.get("command"), r.get("target"),
                                     json.dumps(r.get("confs")), r.get("note"), r.get("bytecode")))
    for run in reversed(series):
        r = dict(run.first, runs=len(run.records))
        body = run_header(r, args(r), level="") + table(detail, run.records)
        title = f"{title_of(run)}: {r.get('command') or 'run'}, target {r.get('target') or 'local'}" + \
                (f", {r['bytecode']}" if r.get("bytecode") else "")
        out += f'??? note "{title}"\n\n' + indent(body) + "\n"
    return out


def session_start() -> str:
    recs = load("session_start.jsonl")
    runs = group(recs, lambda r: (r.get("date"), r.get("commit")))
    cols = [Col("variant", "variant"), Col("samples", "n"), Col("start to first query s (median)", "start"),
            Col("lowest – highest", "span"), Col("first catalog statement s (median)", "catalog")]

    def render(run: Run) -> str:
        by: dict = {}
        for r in run.records:
            if "variant" in r:
                by.setdefault(r["variant"], []).append(r)
        rows = [{"variant": v, "n": len(rs), "start": median([r.get("start_s") for r in rs]),
                 "span": span(min(r["start_s"] for r in rs), max(r["start_s"] for r in rs)),
                 "catalog": median([r.get("catalog_s") for r in rs])} for v, rs in by.items()]
        out = table(cols, rows)
        for s in [r for r in run.records if "summary" in r]:
            flat = []

            def walk(prefix, v, flat=flat):
                if isinstance(v, dict):
                    for k, x in v.items():
                        walk(f"{prefix}{k} ", x, flat)
                else:
                    flat.append((prefix.strip().replace("_", " "), v))
            walk("", s["summary"])
            out += "\nThe benchmark's summary:\n\n" + kv_table(flat)
        return out
    return sources_line("session_start.jsonl") + runs_newest_first(
        runs, render, title_of, lambda run: "benchmarks/session_start.py --runs "
        + str(next((r["summary"].get("runs") for r in run.records if "summary" in r), "?")))


def noop_run() -> str:
    recs = load("noop_run.jsonl")
    cols = [Col("TPC-H SF", "tpch_sf"), Col("models", "models"),
            Col("each model s", lambda r: span(r.get("model_s_min"), r.get("model_s_max"))),
            Col("whole run s", lambda r: span(r.get("whole_run_s_min"), r.get("whole_run_s_max")))]
    return sources_line("noop_run.jsonl") + runs_newest_first(
        group(recs, lambda r: (r.get("date"), r.get("commit"))), lambda run: table(cols, run.records), title_of)


def connect_vs_classic() -> str:
    recs = load("connect_vs_classic.jsonl")

    def render(run: Run) -> str:
        out = ""
        for s in [r for r in run.records if r.get("summary")]:
            rows = [{"model": m, **v} for m, v in s.get("models", {}).items()]
            out += table([Col("model (dbt node time, median)", "model"), Col("classic session s", "classic_s"),
                          Col("Spark Connect s", "connect_s"), Col("Connect / classic", "connect_vs_classic")], rows)
            parts = [("the whole `dbt run`, process start included", "wall_s"),
                     ("the models", "models_s"), ("the session before the first model", "session_s")]
            out += "\n" + table([Col("median of the runs", lambda p: p[0]),
                                 Col("classic session s", lambda p, s=s: get(s, p[1] + ".classic")),
                                 Col("Spark Connect s", lambda p, s=s: get(s, p[1] + ".connect")),
                                 Col("Connect / classic", lambda p, s=s: get(s, p[1] + ".connect_vs_classic"))],
                                parts)
            out += f"\nRuns: {num(s.get('runs'))} per variant; workers: {num(s.get('workers'))}.\n\n"
        detail = [r for r in run.records if not r.get("summary")]
        cols = [Col("run", "run"), Col("variant", "variant"), Col("whole run s", "wall_s"),
                Col("interpreter and imports s", "start_s"), Col("parse s", "parse_s"),
                Col("session s", "session_s"), Col("models s", "models_s"), Col("after the last model s", "end_s")]
        out += '??? note "Each run"\n\n' + indent(table(cols, sorted(detail, key=lambda r: (r["variant"], r["run"]))))
        return out
    return sources_line("connect_vs_classic.jsonl") + runs_newest_first(
        group(recs, lambda r: (r.get("date"), r.get("commit"))), render, title_of)


def object_store() -> str:
    recs = [r for r in load("object_store.jsonl") if not is_summary(r)]
    cols = [Col("model", "model"), Col("small rounds", "batches"), Col("added latency ms (each way)", "latency_ms"),
            Col("run s local (median)", "local_run_s_median"), Col("run s S3 (median)", "s3_run_s_median"),
            Col("S3 / local", "ratio_s3_to_local"), Col("batch s local", "local_batch_s_median"),
            Col("batch s S3", "s3_batch_s_median"), Col("requests a run (median)", "s3_requests_per_run_median"),
            Col("requests a run: fewest – most",
                lambda r: (span(min(r["s3_requests_per_run"]), max(r["s3_requests_per_run"]))
                           if r.get("s3_requests_per_run") else None)),
            Col("last run's requests by method", "s3_requests_by_kind_last"),
            Col("run's own count vs the server's (largest difference)", "client_to_server_max_deviation"),
            Col("verified local / S3", lambda r: f"{num(r.get('verified_local'))} / {num(r.get('verified_s3'))}")]
    runs = group(recs, lambda r: (r.get("date"), r.get("commit"), r.get("note"), r.get("latency_ms"),
                                  r.get("batches"), r.get("fresh"), r.get("data_cache_mb")))

    def command(run: Run) -> str:
        r = run.first
        lat = r.get("latency_ms")
        return (("CONSISTENT_STREAM_DATA_CACHE_MB=0 " if r.get("data_cache_mb") == 0 else "")
                + f"benchmarks/object_store.py --sf {num(r.get('sf'))} --batches {r.get('batches')}"
                + (f" --latency-ms {int(lat)}" if lat else "") + (" --fresh" if r.get("fresh") else ""))

    def what(run: Run) -> str:
        r = run.records[-1]
        by = r.get("client_requests_by_what_last") or r.get("s3_requests_by_what_last")
        return (("\nWhat the last run's requests were for (" + run.records[-1]["model"] + "): " + num(by) + "\n")
                if by else "")
    return sources_line("object_store.jsonl") + runs_newest_first(
        runs, lambda run: table(cols, run.records) + what(run),
        lambda run: (f"{title_of(run)}, {run.first.get('batches')} rounds, "
                     f"{num(run.first.get('latency_ms') or 0)} ms added"
                     + (", each S3 run as a new process" if run.first.get("fresh") else "")
                     + (", no data files kept" if run.first.get("data_cache_mb") == 0 else "")),
        command)


def kafka_catch_up() -> str:
    recs = load("kafka_catch_up.jsonl")
    summaries = [r for r in recs if r.get("summary")]
    cols = [Col("date", "date"), Col("commit", "commit"),
            Col("arguments",
                lambda r: (r.get("command") or "").replace("benchmarks/kafka_catch_up.py", "").strip() or None),
            Col("data-topic partitions", lambda r: r.get("partitions", 1)),
            Col("pgbench transactions", "pgbench_transactions"), Col("data-topic events", "events"),
            Col("transaction-topic records", "transaction_topic_messages"),
            Col("consistent_stream s (median)", "consistent_stream_median_s"),
            Col("Flink SQL s (median)", "flink_median_s"),
            Col("Flink s / ours", "flink_s_over_consistent_stream_s"),
            Col("ours, every read on Spark s (median)", "spark_reads_median_s"),
            Col("`driver_read_records`", "driver_read_records"),
            Col("answers = PostgreSQL", "all_rows_match_postgres")]
    detail = [Col("engine", lambda r: r.get("engine") + (f" ({r['variant']})" if r.get("variant") else "")),
              Col("run", "run"), Col("seconds", "seconds"), Col("events/s", "events_per_s"),
              Col("driver CPU s", "driver_cpu_s"),
              Col("JVM CPU s", lambda r: r.get("jvm_cpu_s", r.get("jvm_cpu_seconds"))),
              Col("driver peak MiB", "driver_peak_rss_mib"), Col("JVM peak MiB", "jvm_peak_rss_mib"),
              Col("Python workers peak MiB", "python_workers_peak_rss_mib"),
              Col("changes on disk MiB", "changes_on_disk_mib"), Col("Flink changelog rows", "changelog_rows"),
              Col("answer = PostgreSQL", "rows_match")]
    out = sources_line("kafka_catch_up.jsonl")
    out += "## Every run, newest first\n\nOne row per benchmark run (the median of its runs of each engine). "
    out += f"Machine: {summaries[-1].get('machine', 'not recorded') if summaries else 'not recorded'}; each run's "
    out += "command is `.venv/bin/python benchmarks/kafka_catch_up.py` with its arguments.\n\n"
    out += table(cols, list(reversed(summaries)))
    out += "\n## Each run's engines\n\n"
    engine_runs = group([r for r in recs if not r.get("summary")], lambda r: (r.get("date"), r.get("events")))
    for run in reversed(engine_runs):
        r = run.first
        body = run_header(r, level="") + table(detail, run.records)
        out += f'??? note "{title_of(run)}, {num(r.get("events"))} events"\n\n' + indent(body) + "\n"
    return out


def kafka_bookkeeping() -> str:
    recs = load("kafka_bookkeeping.jsonl")
    cols = [Col("date", "date"), Col("commit", "commit"),
            Col("bytes of live Python a transaction (tracemalloc)", "live_python_bytes_per_transaction"),
            Col("MB at 1,742,069 transactions", "live_python_mb_at_1742069_transactions"),
            Col("bytes a transaction in the spill file (local disk)", "spill_file_bytes_per_transaction")]
    r = recs[-1] if recs else {}
    return (sources_line("kafka_bookkeeping.jsonl") + "## Runs\n\nEach row the code of its commit.\n\n"
            + f"- **Machine:** {r.get('machine', 'not recorded')}\n"
            + f"- **Command:** `.venv/bin/python {r.get('command')}`\n\n"
            + table(cols, recs))


def pgbench_consistency() -> str:
    recs = load("pgbench_consistency.jsonl")
    cols = [Col("model", "model"), Col("run s", "run_s"),
            Col("pgbench scale / clients / rate (tx/s)",
                lambda r: f"{r['pgbench_scale']} / {r['clients']} / {r['rate_tps']}"),
            Col("transactions", "transactions"), Col("versions", "versions"),
            Col("versions breaking the invariant", "versions_invariant_broken"),
            Col("versions differing from batch evaluation", "versions_differing_from_batch_evaluation"),
            Col("final = PostgreSQL", "final_equals_postgresql"),
            Col("foil: versions broken", lambda r: f"{num(r['foil_versions_broken'])} of {num(r['versions'])}"),
            Col("freshness median / max s",
                lambda r: f"{num(r['freshness_median_s'])} / {num(r['freshness_max_s'])}")]
    return sources_line("pgbench_consistency.jsonl") + runs_newest_first(
        group(recs, lambda r: (r.get("date"), r.get("commit"))), lambda run: table(cols, run.records),
        lambda run: f"{title_of(run)}: {run.first['model']}")


def pgbench_catchup() -> str:
    recs = load("pgbench_catchup.jsonl")
    cols = [Col("way through the backlog", "way"), Col("events", "events"), Col("seconds", "seconds"),
            Col("events/s", "events_per_s"), Col("batches", "batches"), Col("Spark jobs", "spark_jobs"),
            Col("driver Python peak MiB", "driver_python_peak_mib"), Col("JVM peak MiB", "jvm_peak_mib"),
            Col("event files", "event_files"), Col("verified", "verified")]
    return sources_line("pgbench_catchup.jsonl") + runs_newest_first(
        group(recs, lambda r: (r.get("date"), r.get("commit"))), lambda run: table(cols, run.records), title_of)


def crash_campaign() -> str:
    recs = load("crash_campaign.jsonl")
    cols = [Col("date", "date"), Col("commit", "commit"), Col("runner", "runner"), Col("store", "store"),
            Col("restart", "restart"), Col("seeds", "seeds"),
            Col("trials (continuous)", lambda r: f"{num(r['trials'])} ({num(r['continuous_trials'])})"),
            Col("killed at a point / after a random delay / point not reached",
                lambda r: f"{num(r['killed_at_point'])} / {num(r['killed_after_random_delay'])} / "
                          f"{num(r['point_not_reached'])}"),
            Col("finished before the delay", "finished_before_random_delay"), Col("wall min", "wall_min"),
            Col("failures", "failures"), Col("note", "note")]
    total = sum(r["trials"] for r in recs)
    fails = sum(r["failures"] for r in recs)
    out = sources_line("crash_campaign.jsonl")
    out += (f"## Campaigns, newest first\n\nIn all: {num(total)} trials, {num(fails)} failures. "
            f"Machine: {recs[0]['machine'] if recs else 'not recorded'}. Each row's command is "
            "`.venv/bin/python benchmarks/crash_campaign.py --trials N --seed S --runner R "
            "[--store s3] [--restart here]` with the row's values.\n\n")
    return out + table(cols, sorted(recs, key=lambda r: r["date"], reverse=True))


def log_copy() -> str:
    recs = load("log_copy.jsonl")
    cols = [Col("commit", "commit"), Col("tombstones", "tombstones"), Col("live files", "files"),
            Col("checkpoint every", lambda r: r.get("checkpoint_interval", 100)),
            Col("commit median / p90 / mean ms",
                lambda r: f"{num(r['commit_median_ms'])} / {num(r['commit_p90_ms'])} / {num(r.get('commit_mean_ms'))}"),
            Col("open from copy ms", "open_from_copy_ms"), Col("open from checkpoint ms", "open_from_checkpoint_ms"),
            Col("copy bytes", "copy_bytes")]
    r = recs[-1] if recs else {}
    return (sources_line("log_copy.jsonl")
            + "## Runs\n\nEach row the code of its commit (a day's runs alternated the commits, base and new); "
            + "the command is `.venv/bin/python benchmarks/log_copy.py --tombstones 1000 10000 86400` with "
            + "`--checkpoint-interval` the row's when it is not 100.\n\n"
            + f"- **Machine:** {r.get('machine', 'not recorded')}\n\n"
            + table(cols, recs))


def long_run() -> str:
    recs = load("long_run.jsonl")
    windows = [r for r in recs if "window_min" in r]
    summary = next((r for r in recs if r.get("summary")), None)
    metrics = [("run process tree RSS (MiB)", "process_tree_rss_mib"),
               ("of which the Python driver (MiB)", "python_driver_rss_mib"),
               ("of which Spark's JVM (MiB)", "jvm_rss_mib"),
               ("JVM heap committed / old generation used (MiB)",
                lambda r: f"{num(r['jvm_heap_committed_mib'])} / {num(r['jvm_old_gen_used_mib'])}"),
               ("seconds per micro-batch (median)", "batch_s_median"),
               ("state rows (in its live files)", "state_rows"),
               ("state files on disk", "state_files"), ("state log KB (JSON + checkpoint)", "state_log_kb"),
               ("target log files", "target_log_files"), ("target log KB (JSON + checkpoint)", "target_log_kb"),
               ("target data files / Change Data Feed files",
                lambda r: f"{num(r['target_data_files'])} / {num(r['target_cdf_files'])}"),
               ("checkpoint directory files", "checkpoint_dir_files"),
               ("checkpoint directory KB", "checkpoint_dir_kb")]
    cols = [Col("median per 5-minute window", lambda m: m[0])] + [
        Col(f"min {w['window_min']}", lambda m, w=w: m[1](w) if callable(m[1]) else w.get(m[1])) for w in windows]
    out = sources_line("long_run.jsonl", "long_run.png")
    if windows:
        out += "## Latest run\n\n" + run_header(windows[0], level="") + table(cols, metrics)
    if summary:
        out += "\n" + kv_table([("minutes", summary.get("minutes")), ("micro-batches", summary.get("micro_batches")),
                                ("source commits", summary.get("source_commits")),
                                ("maintenance passes", summary.get("maintenance_passes")),
                                ("maintenance pass s (median)", summary.get("maintenance_pass_s_median")),
                                ("first batch (the initial build) s", summary.get("first_batch_s")),
                                ("longest batch after the first s", summary.get("longest_batch_after_first_s")),
                                ("live rows", summary.get("live_rows")),
                                ("state rows, highest sample", summary.get("state_rows_highest_sample")),
                                ("last version equals batch evaluation",
                                 summary.get("last_version_equals_batch_evaluation"))])
    later = [r for r in recs if r.get("summary") and r is not summary]
    if later:
        cols = [Col("date", "date"), Col("commit", "commit"), Col("command", lambda r: f"`{r.get('command')}`"),
                Col("micro-batches", "micro_batches"),
                Col("batch s, first / last 5 min",
                    lambda r: f"{num(r.get('batch_s_first_5_min'))} / {num(r.get('batch_s_last_5_min'))}"),
                Col("state commit s, first / last 100 batches",
                    lambda r: f"{num(r.get('commit_state_s_first_100_batches'))} / "
                              f"{num(r.get('commit_state_s_last_100_batches'))}"),
                Col("state rows (range)", lambda r: r.get("state_rows_range")),
                Col("driver RSS last / first", "driver_rss_ratio_last_to_first"),
                Col("last version equals batch evaluation", "last_version_equals_batch_evaluation"),
                Col("note", "note")]
        out += "\n## Later runs, newest first\n\n" + table(cols, list(reversed(later)))
    if (RESULTS / "long_run.png").exists():
        out += ("\n![The long run: memory, batch time, state and logs over time (the newest run)](long_run.png)\n")
    return out


def _autoscale(name: str, title: str) -> str:
    d = load_json(name + ".json")
    if d is None:
        return ""
    out = f"## {title}\n\n" + run_header(d, level="")
    setup = [("order rows/s before and after the step", d.get("rate")), ("the step (x the rate)", d.get("step")),
             ("phases s (before, step, after)", d.get("phases")), ("cores", d.get("cores")),
             ("Spark master", d.get("master")), ("local_engine", d.get("local_engine")), ("model", d.get("model"))]
    out += kv_table([p for p in setup if p[1] is not None], ("setup", "value")) + "\n"
    variants = [(v, d[v]) for v in ("fixed", "scaled") if v in d]
    cols = [Col("variant", lambda p: p[0]),
            Col("parallelism bounds",
                lambda p: f"{p[1]['autoscale']['min_parallelism']}–{p[1]['autoscale']['max_parallelism']}"),
            Col("autoscale settings",
                lambda p: {k: v for k, v in p[1]["autoscale"].items() if "parallelism" not in k}),
            Col("batches", lambda p: len(p[1].get("batches", []))), Col("peak lag s", lambda p: p[1].get("peak_lag_s")),
            Col("peak lag rows", lambda p: p[1].get("peak_lag_rows")),
            Col("lag back under the threshold, s after the step", lambda p: p[1].get("recovered_s_after_step")),
            Col("highest parallelism used", lambda p: p[1].get("max_parallelism_used")),
            Col("decisions", lambda p: (len(p[1]["decisions"]) if isinstance(p[1].get("decisions"), list)
                                        else p[1].get("decisions"))),
            Col("verified", lambda p: p[1].get("verified"))]
    out += table(cols, variants)
    decisions = [dict(b, variant=v) for v, x in variants for b in x.get("batches", []) if b.get("action") != "hold"]
    if decisions:
        out += "\nThe decisions, with their inputs:\n\n" + table(
            [Col("variant", "variant"), Col("t s", "t"), Col("batch", "batch_id"), Col("action", "action"),
             Col("parallelism", lambda b: f"{b['parallelism']} → {b['next_parallelism']}"), Col("batch rows", "rows"),
             Col("batch s", "seconds"), Col("lag rows", "lag_rows"), Col("lag s", "lag_s"), Col("reason", "reason")],
            decisions)
    if (RESULTS / (name + ".png")).exists():
        out += f"\n![{title}]({name}.png)\n"
    return out + "\n"


def autoscale_load_step() -> str:
    return (sources_line("autoscale_load_step.json", "autoscale_load_step.png", "autoscale_load_step_cluster.json",
                         "autoscale_load_step_cluster.png")
            + _autoscale("autoscale_load_step", "Local mode")
            + _autoscale("autoscale_load_step_cluster", "A standalone cluster of two one-core workers"))


def driver_rebuild() -> str:
    recs = load("driver_rebuild.jsonl")
    cols = [Col("TPC-H SF", "tpch_sf"), Col("source rows", lambda r: span(r["source_rows_min"], r["source_rows_max"])),
            Col("on the driver s", lambda r: span(r["driver_rebuild_s_min"], r["driver_rebuild_s_max"])),
            Col("Spark jobs (driver)", "driver_spark_jobs"),
            Col("on the executors s", lambda r: span(r["executors_rebuild_s_min"], r["executors_rebuild_s_max"])),
            Col("Spark jobs (executors)", "executors_spark_jobs"),
            Col("executors / driver",
                lambda r: span(r["ratio_executors_to_driver_min"], r["ratio_executors_to_driver_max"])),
            Col("driver Python peak MB: driver's rebuild / executors'",
                lambda r: (f"{r['driver_python_peak_mb_driver_rebuild']} / "
                           f"{r['driver_python_peak_mb_executors_rebuild']}"
                           if "driver_python_peak_mb_driver_rebuild" in r else None))]
    return sources_line("driver_rebuild.jsonl") + runs_newest_first(
        group(recs, lambda r: (r.get("date"), r.get("commit"))), lambda run: table(cols, run.records), title_of)


def cluster_vs_local() -> str:
    recs = load("cluster_vs_local.jsonl")
    cols = [Col("SF", "tpch_sf"), Col("model", "model"), Col("step", "step"), Col("local s", "local_s"),
            Col("cluster s", "cluster_s"),
            Col("local driver Python / JVM MB",
                lambda r: f"{num(r['local_driver_python_mb'])} / {num(r['local_driver_jvm_mb'])}"),
            Col("cluster driver Python / JVM MB",
                lambda r: f"{num(r['cluster_driver_python_mb'])} / {num(r['cluster_driver_jvm_mb'])}"),
            Col("verified", "verified")]
    runs = group(recs, lambda r: (r.get("date"), r.get("commit"), r.get("command")))
    return sources_line("cluster_vs_local.jsonl") + runs_newest_first(
        runs, lambda run: table(cols, run.records), lambda run: f"{title_of(run)}, SF {num(run.first['tpch_sf'])}")


def verify_run() -> str:
    recs = load("verify_run.jsonl")
    cols = [Col("model", "model"), Col("runs", "runs"), Col("one aggregation s (median)", "one_aggregation_median_s"),
            Col("exceptAll both ways s (median)", "exceptall_median_s"),
            Col("exceptAll / one aggregation", "ratio_exceptall_over_one_aggregation"),
            Col("broadcasts: one aggregation / exceptAll",
                lambda r: f"{num(r['one_aggregation_broadcasts'])} / {num(r['exceptall_broadcasts'])}"),
            Col("SQL executions: one aggregation / exceptAll",
                lambda r: f"{num(r['one_aggregation_sql_executions'])} / {num(r['exceptall_sql_executions'])}")]
    return sources_line("verify_run.jsonl") + runs_newest_first(
        group([r for r in recs if not is_summary(r)], lambda r: (r.get("date"), r.get("commit"))),
        lambda run: table(cols, run.records), title_of)


def float_drift() -> str:
    recs = load("float_drift.jsonl")
    cols = [Col("batch", "batch"), Col("updates so far", "updates"),
            Col("large values deleted", "large_values_deleted"),
            Col("seconds", "seconds"), Col("engine's sums: largest relative difference", "engine_max_rel"),
            Col("plain float64 accumulation", "plain_max_rel"), Col("Spark's batch SUM", "batch_max_rel"),
            Col("verify OK", "verify_ok")]

    def render(run: Run) -> str:
        out = table(cols, [r for r in run.records if not r.get("summary")])
        for s in [r for r in run.records if r.get("summary")]:
            out += "\n" + kv_table([("keys", s.get("keys")), ("groups", s.get("groups")),
                                    ("batches", s.get("batches")), ("updates", s.get("updates")),
                                    ("engine: largest relative difference, whole run", s.get("engine_max_rel")),
                                    ("plain float64: largest relative difference", s.get("plain_max_rel")),
                                    ("Spark's batch SUM: largest relative difference", s.get("batch_max_rel"))])
        return out
    return sources_line("float_drift.jsonl") + runs_newest_first(
        group(recs, lambda r: (r.get("date"), r.get("commit"))), render, title_of)


def demos() -> str:
    recs = load("demos.jsonl")
    cols = [Col("date", "date"), Col("commit", "commit"), Col("command", "command"), Col("exit code", "exit_code"),
            Col("wall", lambda r: (f"{num(r['wall_s'])} s" if "wall_s" in r
                                   else f"{num(r['wall_min'])} min" if "wall_min" in r
                                   else f"{num(r.get('wall_min_fresh_venv'))} min from a fresh .venv, "
                                        f"{num(r.get('wall_min_existing_venv'))} min with it")),
            Col("verify", lambda r: r.get("verify_runs_ok") and f"{r['verify_runs_ok']} OK" or r.get("verify_ok")),
            Col("dbt build", "dbt_build_passed"),
            Col("tasks per worker", lambda r: r.get("tasks_per_worker") or (
                f"initial build {num(r['tasks_initial_build_per_worker'])}; "
                f"final build {num(r['tasks_final_build_per_worker'])}"
                if "tasks_initial_build_per_worker" in r else None)),
            Col("Java processes seen (looks)", lambda r: f"{r['java_processes_seen']} ({num(r['process_looks'])})"
                if "process_looks" in r else None),
            Col("note", "note")]
    machine = recs[0]["machine"] if recs else "not recorded"
    return (sources_line("demos.jsonl") + f"## Runs, newest first\n\nMachine: {machine}.\n\n"
            + table(cols, sorted(recs, key=lambda r: r["date"], reverse=True)))


def design_figures() -> str:
    recs = load("design_figures.jsonl")
    cols = [Col("module", lambda r: f"`{r['module']}`"), Col("decision", "decision"), Col("measured", "measured"),
            Col("date", "date"), Col("how", lambda r: f"`{r['command']}`" if r.get("command") else "by hand")]
    machine = recs[0]["machine"] if recs else "not recorded"
    return (sources_line("design_figures.jsonl")
            + f"## The figures\n\nMachine: {machine}. Commit: not recorded (the code of the date given).\n\n"
            + table(cols, recs))


@dataclass
class Benchmark:
    name: str
    title: str
    summary: str
    section: str
    render: Callable[[], str]
    files: tuple[str, ...]


BENCHMARKS = [
    Benchmark("refresh_vs_full", "Incremental run against dbt's table, merge and full refresh",
              "the example's TPC-H models after one refresh round, at SF 0.1, 1 and 10", "Speed", refresh_vs_full,
              ("refresh_vs_full.jsonl",)),
    Benchmark("tpch_models", "The 22 TPC-H queries as models",
              "each query as written, incremental against a dbt table, SF 1", "Speed", tpch_models,
              ("tpch_models.jsonl",)),
    Benchmark("small_batch_profile", "A small batch's run",
              "a run after a small change at SF 1, by phase, against DuckDB's full recompute", "Speed",
              small_batch_profile, ("small_batch_profile.jsonl",)),
    Benchmark("compile_time", "A model's first compile",
              "the 99 TPC-DS queries compiled and typed, against Spark's analysis of the same SQL", "Speed",
              compile_time, ("compile_time.jsonl",)),
    Benchmark("dbt_run_start", "A whole dbt run after a small change",
              "process start, session, models and the view of a fresh `dbt run`", "Speed", dbt_run_start,
              ("dbt_run_start.jsonl",)),
    Benchmark("session_start", "A Spark session's start",
              "a local session with and without delta-spark, the other jars and Hive", "Speed", session_start,
              ("session_start.jsonl",)),
    Benchmark("noop_run", "A dbt run with nothing to do", "every model up to date", "Speed", noop_run,
              ("noop_run.jsonl",)),
    Benchmark("connect_vs_classic", "Spark Connect against a classic session",
              "the same project on one cluster, per model and per run", "Speed", connect_vs_classic,
              ("connect_vs_classic.jsonl",)),
    Benchmark("driver_rebuild", "Where a rebuild runs", "a `--full-refresh` on the driver against the executors",
              "Speed", driver_rebuild, ("driver_rebuild.jsonl",)),
    Benchmark("no_cdf_batch", "A source without the Change Data Feed",
              "a small batch read from the Delta log against the same batch read from the feed", "Speed",
              no_cdf_batch, ("no_cdf_batch.jsonl",)),
    Benchmark("object_store", "Local disk against an S3 server",
              "run time and requests with every location on S3 (s3proxy)", "Deployment", object_store,
              ("object_store.jsonl",)),
    Benchmark("cluster_vs_local", "Local mode against a standalone cluster",
              "initial builds and a refresh round, time and driver memory", "Deployment", cluster_vs_local,
              ("cluster_vs_local.jsonl",)),
    Benchmark("autoscale_load_step", "Autoscaling under a load step",
              "a continuous model's lag and parallelism through a 10x step", "Deployment", autoscale_load_step,
              ("autoscale_load_step.json", "autoscale_load_step_cluster.json")),
    Benchmark("long_run", "A long continuous run", "memory, state and logs of a continuous model over half an hour",
              "Deployment", long_run, ("long_run.jsonl",)),
    Benchmark("log_copy", "A commit against a week of tombstones",
              "a target's commit and open as its log's removed files grow", "Deployment", log_copy,
              ("log_copy.jsonl",)),
    Benchmark("kafka_catch_up", "Debezium on Kafka: catch-up against Flink SQL",
              "the same query over the same topics, both answers checked", "Sources", kafka_catch_up,
              ("kafka_catch_up.jsonl",)),
    Benchmark("kafka_bookkeeping", "Kafka reader: memory per transaction",
              "what the driver keeps per published transaction", "Sources", kafka_bookkeeping,
              ("kafka_bookkeeping.jsonl",)),
    Benchmark("pgbench_catchup", "PostgreSQL CDC: a backlog's catch-up",
              "a captured pgbench backlog, cold, warm and as a rebuild", "Sources", pgbench_catchup,
              ("pgbench_catchup.jsonl",)),
    Benchmark("pgbench_consistency", "PostgreSQL CDC: consistency under pgbench",
              "TPC-B's invariant at every version, against per-table cuts", "Correctness", pgbench_consistency,
              ("pgbench_consistency.jsonl",)),
    Benchmark("crash_campaign", "Kill -9 anywhere: the crash campaign",
              "runs killed at every step of the protocol, then checked", "Correctness", crash_campaign,
              ("crash_campaign.jsonl",)),
    Benchmark("tpcds_coverage", "The 99 TPC-DS queries: coverage",
              "103 statements compiled and maintained through refresh rounds", "Correctness", tpcds_coverage,
              ("tpcds_coverage.jsonl",)),
    Benchmark("float_drift", "Floating-point sums under retractions", "compensated accumulators against plain float64",
              "Correctness", float_drift, ("float_drift.jsonl",)),
    Benchmark("verify_run", "What a verify costs", "one aggregation against exceptAll both ways", "Correctness",
              verify_run, ("verify_run.jsonl",)),
    Benchmark("demos", "Demo runs", "the cluster, S3 and Spark Connect demos end to end", "Other", demos,
              ("demos.jsonl",)),
    Benchmark("design_figures", "Figures behind the design", "the measurements behind design decisions in the code",
              "Other", design_figures, ("design_figures.jsonl",)),
]


def intro(name: str) -> str:
    path = INTRO / f"{name}.md"
    return path.read_text().strip() + "\n\n" if path.exists() else ""


def page(b: Benchmark) -> str:
    return f"# {b.title}\n\n" + intro(b.name) + b.render()


def _latest_date(b: Benchmark) -> str | None:
    dates = []
    for f in b.files:
        if f.endswith(".jsonl"):
            dates += [r.get("date") for r in load(f)]
        else:
            d = load_json(f)
            dates.append(d.get("date") if d else None)
    dates = [d for d in dates if d]
    return max(dates) if dates else None


def headline() -> list[tuple[str, str, str]]:
    """(what, figure, page) for the overview: each computed from the newest records."""
    out = []
    t = [r for r in load("tpch_models.jsonl") if not is_summary(r)]
    if t:
        ratios = [r["ratio_table_to_incremental"] for r in t]
        out.append(("22 TPC-H queries at SF 1: a dbt `table` rebuild's time / the incremental run's",
                    f"{num(min(ratios))}x–{num(max(ratios))}x, median {num(median(ratios))}x "
                    f"({sum(1 for r in t if r.get('verified'))} of {len(t)} verified)", "tpch_models"))
    rv = [r for r in load("refresh_vs_full.jsonl") if not is_summary(r) and r.get("sf") == 10]
    if rv:
        last = {}
        for r in rv:
            last[r["model"]] = r
        out.append(("TPC-H SF 10, the example models after a refresh round: dbt `table` / incremental",
                    ", ".join(f"{m} {num(r['ratio_table_to_incremental'])}x" for m, r in last.items()),
                    "refresh_vs_full"))
    sb = [r for r in load("small_batch_profile.jsonl")]
    if sb:
        key = (sb[-1].get("date"), sb[-1].get("commit"), sb[-1].get("note"))
        latest = [r for r in sb if (r.get("date"), r.get("commit"), r.get("note")) == key]
        out.append(("a small batch's whole run at SF 1 (median)",
                    span(min(r["run_s_median"] for r in latest), max(r["run_s_median"] for r in latest)) + " s",
                    "small_batch_profile"))
    ds = [r for r in load("dbt_run_start.jsonl") if r.get("summary") and (r.get("command") or "run") == "run"]
    warm = [r for r in ds if r.get("target") == "warm"]
    if warm:
        out.append(("a whole `dbt run` after a small change, process start included, warm session (median)",
                    f"{num(warm[-1]['wall_s_median'])} s", "dbt_run_start"))
    k = [r for r in load("kafka_catch_up.jsonl") if r.get("summary") and r.get("events", 0) > 3_000_000]
    if k:
        out.append(("Debezium on Kafka, catch-up of the largest history: Flink SQL's time / ours",
                    f"{num(k[-1]['flink_s_over_consistent_stream_s'])}x ({num(k[-1]['events'])} events)",
                    "kafka_catch_up"))
    c = load("crash_campaign.jsonl")
    if c:
        out.append(("crash campaign: runs SIGKILLed at every protocol step, then checked",
                    f"{num(sum(r['trials'] for r in c))} trials, {num(sum(r['failures'] for r in c))} failures",
                    "crash_campaign"))
    tc = [r for r in load("tpcds_coverage.jsonl") if isinstance(r.get("summary"), dict)]
    if tc:
        s = tc[0]["summary"]
        out.append(("TPC-DS statements compiled as written, with no recompute operator",
                    f"{num(s['compiled'])} of {num(s['queries'])}", "tpcds_coverage"))
    return out


def index() -> str:
    out = ["# Benchmarks\n\n", intro("index")]
    out.append("## Headline figures\n\nEach computed at build time from the newest records of its benchmark.\n\n")
    out.append(table([Col("what", lambda h: h[0]), Col("figure", lambda h: h[1]),
                      Col("benchmark", lambda h: f"[{h[2]}]({h[2]}.md)")], headline()))
    sections: dict[str, list[Benchmark]] = {}
    for b in BENCHMARKS:
        sections.setdefault(b.section, []).append(b)
    for section, bs in sections.items():
        out.append(f"\n## {section}\n\n")
        out.append(table([Col("benchmark", lambda b: f"[{b.title}]({b.name}.md)"),
                          Col("what it measures", lambda b: b.summary),
                          Col("newest run", lambda b: _latest_date(b)),
                          Col("results", lambda b: ", ".join(f"`{f}`" for f in b.files))], bs))
    return "".join(out)


def images() -> list[str]:
    return [p.name for p in sorted(RESULTS.glob("*.png"))]


def pages() -> dict[str, str]:
    return {"benchmarks/index.md": index(), **{f"benchmarks/{b.name}.md": page(b) for b in BENCHMARKS}}


def main() -> None:
    """Run by mkdocs (gen-files): the pages and the PNGs into the site's files."""
    import mkdocs_gen_files
    for path, text in pages().items():
        with mkdocs_gen_files.open(path, "w") as f:
            f.write(text)
    for name in images():
        with mkdocs_gen_files.open(f"benchmarks/{name}", "wb") as f:
            f.write((RESULTS / name).read_bytes())


if __name__ == "__main__":
    # by hand: `python docs/gen/benchmarks.py OUT_DIR` writes the pages under OUT_DIR;
    # `--check` prints each page's size
    if sys.argv[1:] == ["--check"]:
        for path, text in pages().items():
            print(f"{path}: {len(text):,} characters")
    elif len(sys.argv) == 2:
        out = Path(sys.argv[1])
        for path, text in pages().items():
            (out / path).parent.mkdir(parents=True, exist_ok=True)
            (out / path).write_text(text)
        print(f"{len(pages())} pages under {out}")
    else:
        sys.exit("usage: python docs/gen/benchmarks.py OUT_DIR | --check")
else:
    main()
