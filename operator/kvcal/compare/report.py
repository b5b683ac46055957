"""Renders compare rows (one per served configuration) as a terminal table and as markdown: metrics down, configs
across, so the BF16 baseline sits next to each FP8 variant."""

from collections.abc import Callable, Sequence
from typing import Any

Row = dict[str, Any]


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ms(value: Any) -> str:
    return "-" if value is None else f"{1000 * value:.0f} ms"


def _lat(key: str) -> Callable[[Row], str]:
    return lambda r: _ms(r.get("latency", {}).get(key))


def _needle(length: str) -> Callable[[Row], str]:
    def cell(r: Row) -> str:
        value = r.get("needle", {}).get(length)
        return "-" if value is None else f"{_pct(value)}"

    return cell


def _metrics(rows: Sequence[Row]) -> list[tuple[str, Callable[[Row], str]]]:
    lengths: list[str] = []
    for r in rows:
        lengths += [n for n in r.get("needle", {}) if n not in lengths]
    base: list[tuple[str, Callable[[Row], str]]] = [
        ("KV cache dtype (engine)", lambda r: str(r.get("engineKvCacheDtype") or r.get("kvCacheDtype"))),
        ("KV cache capacity (tokens)", lambda r: _num(r.get("kvCacheTokens"), ",d")),
        ("top-1 agreement vs BF16", lambda r: _pct(r.get("top1Agreement")) if r.get("positions") else "ref"),
        (
            "mean |Δ logprob| vs BF16",
            lambda r: _num(r.get("logprobDeltaMeanAbs"), ".4f") if r.get("positions") else "ref",
        ),
        ("mean Δ logprob vs BF16", lambda r: _num(r.get("logprobDeltaMean"), "+.4f") if r.get("positions") else "ref"),
        (
            "max |Δ logprob| vs BF16",
            lambda r: _num(r.get("logprobDeltaMaxAbs"), ".3f") if r.get("positions") else "ref",
        ),
        ("probe exact match", lambda r: _pct(r.get("exactMatch"))),
        ("greedy replies same as BF16", lambda r: _pct(r.get("sameAsBf16")) if "sameAsBf16" in r else "ref"),
    ]
    base += [(f"needle @ {n} tokens", _needle(n)) for n in lengths]
    base += [
        ("TTFT p50 / p95", lambda r: f"{_lat('ttftP50')(r)} / {_lat('ttftP95')(r)}"),
        ("inter-token p50 / p95", lambda r: f"{_lat('itlP50')(r)} / {_lat('itlP95')(r)}"),
        ("e2e p50 / p95", lambda r: f"{_lat('e2eP50')(r)} / {_lat('e2eP95')(r)}"),
        ("server start-up", lambda r: _num(r.get("startupSeconds"), ".0f") + " s" if r.get("startupSeconds") else "-"),
    ]
    return base


def _cells(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    header = ["metric", *[r["name"] for r in rows]]
    body = []
    for label, cell in _metrics(rows):
        body.append([label, *[cell(r) if r.get("status") == "ok" else "-" for r in rows]])
    return header, body


def _skipped(rows: Sequence[Row]) -> list[str]:
    return [f"{r['name']}: {r['status']}" for r in rows if r.get("status") != "ok"]


def table(rows: Sequence[Row]) -> str:
    header, body = _cells(rows)
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*["-" * w for w in widths])]
    lines += [fmt.format(*line) for line in body]
    return "\n".join([*lines, *_skipped(rows)])


def markdown(rows: Sequence[Row], title: str, context: Sequence[str]) -> str:
    header, body = _cells(rows)
    lines = [f"# {title}", "", *[f"- {c}" for c in context], ""]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join("---" for _ in header) + "|")
    lines += ["| " + " | ".join(line) + " |" for line in body]
    skipped = _skipped(rows)
    if skipped:
        lines += ["", *[f"- {s}" for s in skipped]]
    return "\n".join(lines) + "\n"
