"""benchmark.md: one table of the report's rows (CPU or ``--device cuda``) and the notes that say how to read it.

The fairseq side-by-side table, when there is one, follows it (:func:`transformer_mt.benchmark.peer.render`).
"""

from __future__ import annotations

from transformer_mt.benchmark.settings import DTYPES

COLUMNS = [
    "phase",
    "model",
    "dtype",
    "tokens/s",
    "updates/s",
    "sentences/s",
    "GFLOP/s",
    "% of peak",
    "peak RSS MiB",
    "vs quoted reference",
]
COLUMNS_CUDA = [
    "phase",
    "model",
    "dtype",
    "tokens/s",
    "updates/s",
    "sentences/s",
    "TFLOP/s",
    "MFU %",
    "peak GPU MiB",
    "notes",
]
NOT_REPRESENTATIVE = "† not representative: the {} after only the benchmark's updates (outputs too long); pass {}."


def num(x: float | None, fmt: str) -> str:
    return "" if x is None else format(x, fmt)


def table(columns: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def syncs_line(sy: dict) -> str:
    steps = "; ".join(
        f"{t['search']} batch {t['batch']}: {t['per_step_max']} (median {t['per_step_median']:g})" for t in sy["search"]
    )
    return (
        f"Host syncs ({sy['device']}, transformer_mt.runtime.SyncCounter): per training update of the recipe model "
        f"{', '.join(str(u['syncs']) for u in sy['train_updates'])} (budget 1); "
        f"per search step, the most over the steps: {steps} "
        "(budget 1, whatever the batch and beam)."
    )


def render_markdown(r: dict) -> str:
    """The report as markdown: the CPU table, or the ``--device cuda`` one."""
    if r.get("device") == "cuda":
        return render_markdown_cuda(r)
    m, s = r["machine"], r["settings"]
    lines = [
        f"# transformer_mt benchmark{' (quick mode: tiny models, not a measurement)' if r['quick'] else ''}",
        "",
        f"{r['date']}; {m['cpu']}, {m['logical_cpus']} logical CPUs, {r['threads']} threads; "
        f"torch {m['torch']} ({m['cpu_capability']}); "
        f"load average {r['loadavg_start'][0]:.2f} at start, {r['loadavg_end'][0]:.2f} at end.",
        f"Training: {s['warmup_updates']} untimed + {s['timed_updates']} timed updates; "
        "tokens/s = non-pad target tokens per second. "
        f"Config: {s['config']}{' (' + s['config_note'] + ')' if s['config_note'] else ''}.",
        "",
        *table(COLUMNS, _cpu_rows(r)),
        "",
        *_cpu_notes(r),
    ]
    return "\n".join(lines) + "\n"


def _vs(v: dict | None, unit: str) -> str:
    return "" if v is None else f"{v['ratio']:.2f}x of {v['quoted']:,.0f} {unit} (target {v['target_ratio']:g}x)"


def _cpu_rows(r: dict) -> list[list[str]]:
    mm = r["matmul_peak"]
    rows = [
        [
            f"matmul peak (n={mm['n']})",
            "",
            d,
            "",
            "",
            "",
            num(mm[d]["gflops"], ".1f"),
            "",
            num(mm["peak_rss_mib"], ".0f"),
            "",
        ]
        for d in DTYPES
    ]
    for t in r["training"]:
        plain = " [plain ops]" if t["ops"] == "plain" else ""
        speedup = "" if t.get("speedup_vs_plain_ops") is None else f"{t['speedup_vs_plain_ops']:.2f}x of plain ops"
        versus = "; ".join(x for x in (_vs(t["vs_quoted"], "tok/s (fairseq)"), speedup) if x)
        rate = [
            num(t["tokens_per_s"], ",.0f"),
            num(t["updates_per_s"], ".3f"),
            "",
            num(t["gflops"], ".1f"),
            num(100 * t["fraction_of_peak"], ".1f"),
        ]
        rows.append(
            [
                f"train{plain}",
                f"{t['model']} ({t['description']})",
                t["dtype"],
                *rate,
                num(t["peak_rss_mib"], ".0f"),
                versus,
            ]
        )
    for t in r["translation"]:
        flag = "" if t["representative"] else " †"
        rate = [
            num(t["tokens_per_s"], ",.0f"),
            "",
            num(t["sentences_per_s"], ".1f"),
            "",
            "",
            num(t["peak_rss_mib"], ".0f"),
        ]
        rows.append(
            [
                f"translate {t['search']}{flag}",
                f"{t['model']} ({t['description']})",
                t["dtype"],
                *rate,
                _vs(t["vs_quoted"], "sent/s (fairseq)"),
            ]
        )
    for t in r.get("ctranslate2", []):  # --ctranslate2: tmt and CTranslate2 on the same checkpoint, lines and settings
        flag = "" if t["representative"] else " †"
        for engine, e in t["engines"].items():
            ratio = e["tokens_per_s"] / t["engines"]["tmt"]["tokens_per_s"]
            versus = f"one sentence p50 {e['latency_p50_ms']:.1f} ms"
            if engine != "tmt":
                versus += f"; {ratio:.2f}x of tmt's tokens/s; {100 * e['same_as_tmt']:.1f}% same output"
            phase = f"translate {t['search']} lenpen 0 [{engine.removesuffix(' ' + e['dtype'])}]{flag}"
            rate = [num(e["tokens_per_s"], ",.0f"), "", num(e["sentences_per_s"], ".1f"), "", ""]
            rows.append(
                [phase, f"{t['model']} ({t['description']})", e["dtype"], *rate, num(t["peak_rss_mib"], ".0f"), versus]
            )
    return rows


# The shares of the fp32 matmul peak the training update is held to, per benchmark model.
PEAK_TARGETS = {"recipe": 0.65, "reference": 0.75}


def peak_share_line(r: dict) -> str:
    """One line: each model's float32 training update as a share of the fp32 matmul peak, against its target."""
    parts = [
        f"{t['model']} {100 * t['fraction_of_peak']:.1f}% (target {100 * PEAK_TARGETS[t['model']]:.0f}%)"
        for t in r["training"]
        if t["ops"] == "fast"
        and t["dtype"] == "float32"
        and t["model"] in PEAK_TARGETS
        and t.get("fraction_of_peak") is not None
    ]
    peak = r["matmul_peak"]["float32"]["gflops"]
    return f"Training update, share of the fp32 matmul peak ({peak:.1f} GFLOP/s): {'; '.join(parts)}."


def _cpu_notes(r: dict) -> list[str]:
    q = r["quoted_reference"]
    train = ", ".join(f"{k} {v:,} tok/s" for k, v in q["train_tokens_per_s"].items())
    beam5 = ", ".join(f"{k} {v} sent/s" for k, v in q["beam5_sentences_per_s"].items())
    lines = [
        peak_share_line(r),
        "Plain ops: the same training with torch's F.dropout, autograd through ScaleNorm's formula, "
        "SDPA for every attention "
        "and the unfused logits + loss path (the reference backend, train.ops: reference), "
        "the baseline of the CPU speed-ups. GFLOP/s: FLOPs per target token of the timed batches x tokens/s "
        "(the analytic count of "
        "every timed batch, checked against FlopCounterMode on batches spread over the window); % of peak: "
        "of the matmul peak of the same dtype (the faster of its timings at the start and at the end of the run) "
        "measured above. Peak RSS: each phase in its own process, the interpreter and torch included.",
        f"Quoted reference figures are {q['source']}: training {train}; beam 5 {beam5} ({q['setting']}); "
        f"matmul peak {q['matmul_peak_gflops']['float32']} GFLOP/s float32, "
        f"{q['matmul_peak_gflops']['bfloat16']} bfloat16.",
    ]
    if r.get("ctranslate2"):
        passes = len(next(iter(r["ctranslate2"][0]["engines"].values())).get("passes", [None]))
        lines.append(
            f"CTranslate2 {r['ctranslate2'][0]['ctranslate2_version']} rows, length penalty 0, "
            "in one process per search: CTranslate2 "
            "called as its users call it (one translate_batch over all lines, tokens batches of decode.batch_tokens; "
            "the call alone timed), the same through `tmt translate --engine ctranslate2`'s engine "
            "(tokenizing and detokenizing timed), "
            "and tmt's own search, whose outputs the same-output shares compare with; one sentence p50: the median of "
            f"{r['ctranslate2'][0]['latency_sentences']} one-line calls; each row's best of {passes} "
            "passes, the rows in turn, each pass in a fresh process; peak RSS is the phase's (all engines)."
        )
    if r.get("syncs"):
        lines.append(syncs_line(r["syncs"]))
    if any(not t["representative"] for t in r["translation"]):
        lines.append(NOT_REPRESENTATIVE.format("reference model", "--reference-checkpoint"))
    return lines


def render_markdown_cuda(r: dict) -> str:
    """The ``--device cuda`` report: MFU against the bf16 dense peak, peak GPU memory per training row."""
    m, s = r["machine"], r["settings"]
    lines = [
        f"# transformer_mt benchmark on {r['gpu']}"
        f"{' (quick mode: tiny models, not a measurement)' if r['quick'] else ''}",
        "",
        f"{r['date']}; {r['gpu']}; host {m['cpu']}; torch {m['torch']}.",
        f"Training: {s['warmup_updates']} untimed + {s['timed_updates']} timed updates; "
        "tokens/s = non-pad target tokens per second. "
        f"MFU: model FLOPs (the analytic formula, padding included) per second over the bf16 dense peak, "
        f"{r['bf16_dense_peak_tflops']:.1f} TFLOP/s ({r['peak_source']}), for the float32 (TF32) rows too.",
        "",
        *table(COLUMNS_CUDA, _cuda_rows(r)),
    ]
    if r.get("syncs"):
        lines += ["", syncs_line(r["syncs"])]
    if any(not t["representative"] for t in r["translation"]):
        lines.append(NOT_REPRESENTATIVE.format("recipe model", "--checkpoint"))
    return "\n".join(lines) + "\n"


def _tf32(dtype: str) -> str:
    return dtype + (" (TF32)" if dtype == "float32" else "")  # float32 matmuls on a GPU run in TF32 (runtime.use_cuda)


def _cuda_rows(r: dict) -> list[list[str]]:
    mm = r["matmul_peak"]
    rows = [
        [f"matmul peak (n={mm['n']})", "", _tf32(d), "", "", "", num(mm[d]["gflops"] / 1e3, ".1f"), "", "", ""]
        for d in DTYPES
    ]
    for t in r["training"]:
        compiled = t["ops"] == "compiled"
        note = f"{t['max_tokens']:,}-token batches" + ("; torch.compile" if compiled else "")
        rate = [
            num(t["tokens_per_s"], ",.0f"),
            num(t["updates_per_s"], ".2f"),
            "",
            num(t["gflops"] / 1e3, ".1f"),
            num(100 * t["mfu"], ".1f"),
        ]
        phase = f"train{' [compiled]' if compiled else ''}"
        rows.append(
            [
                phase,
                f"{t['model']} ({t['description']})",
                _tf32(t["dtype"]),
                *rate,
                num(t.get("gpu_peak_memory_mib"), ",.0f"),
                note,
            ]
        )
    for t in r["translation"]:
        flag = "" if t["representative"] else " †"
        rate = [num(t["tokens_per_s"], ",.0f"), "", num(t["sentences_per_s"], ".1f"), "", "", ""]
        rows.append(
            [
                f"translate {t['search']}{flag}",
                f"{t['model']} ({t['description']})",
                t["dtype"],
                *rate,
                f"{t['sentences']} sentences",
            ]
        )
    return rows
