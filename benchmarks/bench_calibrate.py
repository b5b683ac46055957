"""Benchmark `kvcal calibrate` on the demo model against a plain BF16 forward pass over exactly the same calibration
tokens, at the bundled prompts' lengths and at long context; time and peak RSS, one subprocess per measurement.

    python benchmarks/bench_calibrate.py [--samples 16|0] [--max-seq-length 512] [--holdout-samples 4]
                                         [--long-lengths 4096,8192] [--long-samples 1] [--eager-up-to 4096]
                                         [--eager]
                                         [--compare-pipelines] [--compare-observers] [--json FILE]

Rows: first as the operator runs it: the calibrator config the operator's Job reads (core/manifests/jobs.py) for a
KVCalibration at the CRD's defaults but samples (--samples) and maxSeqLength (--max-seq-length), on the bundled
calibration set, so holdoutFraction 0.1 of the samples used is scored (plain forward, `kvcal calibrate` and
`--oneshot` only); then the bundled prompts with a separate held-out file (--samples of them, cut at
--max-seq-length, --holdout-samples held-out ones: 23% of the tokens at the defaults); then for each long length L,
--long-samples samples of exactly L tokens (bundled calibration text run together) with one held-out sample of L/8
tokens (bundled held-out text).
Per row, each in its own process: a plain forward (with the LM head, as the model's own forward runs) before and
after (the smaller time is the reference: a shared machine's load drifts), the bare llm-compressor oneshot as it ships
(eager attention) and with the model's attention, `kvcal calibrate` (everything, with its held-out report: static
min-max scales from one forward pass, calibrator/forward.py), `kvcal calibrate --oneshot` (the same through
llm-compressor's oneshot, as kvcal ran before) and, with --eager, `kvcal calibrate --oneshot` under eager attention.
The bare eager oneshot runs only on rows of at most --eager-up-to tokens per sample: it is a reference, not kvcal's
path, and its time grows with the square of the length (605 s at 4,096 tokens on a 2-core AVX2 CPU).
Two clocks: in-process seconds (the forward loop alone for the plain pass; preflight to report for kvcal calibrate)
and whole-process seconds, spawn to exit (imports, tokenizer and model load included, for both): the second is what
a calibration Job costs against a program that only runs the forward pass.
Peak RSS is the child's ru_maxrss from wait4: the process' whole high-water mark, imports and model included.
"""

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from kvcal.calibrator.config import CalibrationConfig
from kvcal.calibrator.data import Sample
from kvcal.calibrator.recipe import read_scales, run_oneshot
from kvcal.calibrator.taps import Tap, attach, detach
from kvcal.demo import CALIBRATION_SET, HOLDOUT_SET, demo_model_dir

HOLDOUT_SHARE = 8  # long rows: one held-out sample of L / 8 tokens
MEASUREMENTS = {
    "plain": "plain BF16 forward (calibration)",
    "oneshot-eager": "bare oneshot, eager (as llm-compressor ships)",
    "oneshot": "bare oneshot, model attention (kvcal)",
    "calibrate": "kvcal calibrate (all, with report)",
    "calibrate-oneshot": "kvcal calibrate --oneshot (before)",
    "calibrate-eager": "kvcal calibrate --oneshot, eager attention",
}


def threads() -> int:
    return int(os.environ.get("KVCAL_THREADS", "2"))


def load(model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    return model.eval()


def cpu_line() -> str:
    """The CPU and its matmul rate in BF16 and float32 (a CPU without BF16 instructions runs the BF16 model many
    times slower, which changes every ratio below: fixed costs weigh less, forward passes more)."""
    import platform

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown")  # fmt: skip
    rates = {}
    for dtype in (torch.bfloat16, torch.float32):
        weight, x = torch.randn(1536, 576, dtype=dtype), torch.randn(512, 576, dtype=dtype)  # a demo-model MLP GEMM
        torch.nn.functional.linear(x, weight)
        t = time.perf_counter()
        for _ in range(3):
            torch.nn.functional.linear(x, weight)
        rates[dtype] = 3 * 2 * 512 * 576 * 1536 / (time.perf_counter() - t) / 1e9
    import transformers

    # Without .pyc files (and PYTHONDONTWRITEBYTECODE set) each process compiles its imports from source: seconds on
    # both sides that flatter the process ratios; hack/setup-venv.sh compiles them, as the images' installs do.
    compiled = any(Path(transformers.__file__).parent.glob("__pycache__/__init__.*.pyc"))
    return (
        f"CPU: {model}, torch {torch.backends.cpu.get_cpu_capability()}, {threads()} threads; matmul "
        f"BF16 {rates[torch.bfloat16]:.0f} GFLOP/s, float32 {rates[torch.float32]:.0f} GFLOP/s; "
        f"bytecode {'compiled' if compiled else 'NOT compiled (process times include compiling imports)'}"
    )


def calibration_samples(config: CalibrationConfig) -> tuple[list[Sample], list[Sample]]:
    from transformers import AutoTokenizer

    from kvcal.calibrator.run import plan_data

    plan = plan_data(config, AutoTokenizer.from_pretrained(config.model_dir))
    return plan.calibration, plan.holdout


def plain_forward(model: torch.nn.Module, samples: list[Sample]) -> float:
    t = time.perf_counter()
    with torch.no_grad():
        for s in samples:
            model(torch.tensor([s.input_ids]))
    return time.perf_counter() - t


def measure(kind: str, config: CalibrationConfig) -> dict[str, Any]:
    """One measurement, in this (child) process; returns seconds (and extras)."""
    torch.set_num_threads(threads())
    if kind == "plain":
        samples, _ = calibration_samples(config)
        model = load(config.model_dir)
        plain_forward(model, [Sample("warm-up", "text", samples[0].input_ids[:16], 16)])
        return {"seconds": plain_forward(model, samples)}
    if kind in ("oneshot", "oneshot-eager"):
        from kvcal.calibrator.attention import model_attention

        samples, _ = calibration_samples(config)
        model = load(config.model_dir)
        t = time.perf_counter()
        with model_attention("basic") if kind == "oneshot" else nullcontext():
            run_oneshot(model, samples, "tensor", "static_minmax", "basic")
        return {"seconds": time.perf_counter() - t}
    from kvcal.calibrator import run

    if kind == "calibrate-eager":  # as llm-compressor ships: no model_attention context
        run.model_attention = lambda _pipeline: nullcontext()  # type: ignore[assignment,misc]
    if kind in ("calibrate-oneshot", "calibrate-eager"):
        config = config.model_copy(update={"oneshot": True})
    report = run.calibrate(config)
    return {"seconds": report.summary.duration_seconds, "steps": report.timings_seconds}


def child(kind: str, config: CalibrationConfig) -> dict[str, Any]:
    """Run `measure(kind)` in a fresh process; its result plus the process' peak RSS (MiB)."""
    cmd = [sys.executable, __file__, "--measure", kind, "--config", config.model_dump_json(by_alias=True)]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind}: exit {proc.returncode}: {out[-2000:]}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["rssMiB"] = usage.ru_maxrss / 1024  # Linux: KiB
    result["processSeconds"] = wall
    return result


def text_records(source: Path, tokens_per_record: int, records: int, path: Path) -> Path:
    """`records` {"text": ...} lines of at least `tokens_per_record` tokens: the rendered bundled records run
    together (wrapping around), decoded back to text."""
    from transformers import AutoTokenizer

    from kvcal.calibrator import data as D

    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir())
    stream: list[int] = []
    for record in D.read_records(source):
        stream.extend(D.render(record, tokenizer))
    need = tokens_per_record + 64  # decoding and re-encoding may merge a few tokens; truncation cuts the rest
    lines = []
    for i in range(records):
        chunk = [stream[(i * need + j) % len(stream)] for j in range(need)]
        lines.append(json.dumps({"text": tokenizer.decode(chunk, skip_special_tokens=True)}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def operator_config(out: Path, samples: int, max_seq_length: int) -> CalibrationConfig:
    """The config file the operator's calibration Job reads for a KVCalibration at the CRD's defaults but `samples`
    and `maxSeqLength`, on the bundled calibration set; its in-container paths pointed here."""
    from kvcal.core.manifests.jobs import calibration_config
    from kvcal.models.spec import KVCalibrationSpec

    spec = KVCalibrationSpec.model_validate(
        {
            "model": {"source": "pvc://models/smollm2"},
            "calibration": {
                "dataset": {"source": "pvc://models/prompts.jsonl"},
                "samples": samples,
                "maxSeqLength": max_seq_length,
                "output": "pvc://models/smollm2-fp8kv",
            },
            "serving": {"baseline": {"deployment": "llm", "service": "llm"}},
        }
    )
    paths = {"modelDir": str(demo_model_dir()), "data": str(CALIBRATION_SET), "out": str(out)}
    return CalibrationConfig.model_validate(calibration_config(spec) | paths)


def run_row(
    config: CalibrationConfig, eager: bool, eager_up_to: int, label: str, kinds: list[str] | None = None
) -> dict[str, Any]:
    cal, hold = calibration_samples(config)
    row: dict[str, Any] = {
        "label": label,
        "samples": len(cal),
        "maxSeqLength": config.max_seq_length,
        "tokens": sum(len(s.input_ids) for s in cal),
        "holdoutSamples": len(hold),
        "holdoutTokens": sum(len(s.input_ids) for s in hold),
    }
    if kinds is None:
        bare_eager = ["oneshot-eager"] if config.max_seq_length <= eager_up_to else []
        kinds = ["plain", *bare_eager, "oneshot", "calibrate", "calibrate-oneshot", *(["calibrate-eager"] * eager)]
    kinds = [*kinds, "plain"]
    results: dict[str, list[dict[str, Any]]] = {}
    for kind in kinds:
        results.setdefault(kind, []).append(child(kind, config))
        last = results[kind][-1]
        print(f"  {kind}: {last['seconds']:.1f} s ({last['processSeconds']:.1f} s process), {last['rssMiB']:.0f} MiB")
    plain = min(results["plain"], key=lambda r: float(r["seconds"]))
    row["measurements"] = {kind: (plain if kind == "plain" else rs[0]) for kind, rs in results.items()}
    row["plainSeconds"] = [r["seconds"] for r in results["plain"]]
    return row


def print_row(row: dict[str, Any]) -> None:
    m = row["measurements"]
    fwd, proc, rss = (float(m["plain"][key]) for key in ("seconds", "processSeconds", "rssMiB"))
    print(
        f"\n{row['label']}: {row['samples']} calibration samples x <= {row['maxSeqLength']} tokens = {row['tokens']} "
        f"tokens, holdout {row['holdoutSamples']} samples / {row['holdoutTokens']} tokens, {threads()} threads "
        f"(plain forward before/after: {' / '.join(f'{s:.1f}' for s in row['plainSeconds'])} s)"
    )
    print(
        f"{'step':<46}{'seconds':>9}{'x plain fwd':>13}{'process s':>11}{'x plain process':>17}"
        f"{'peak RSS MiB':>14}{'x plain RSS':>13}"
    )
    for kind, name in MEASUREMENTS.items():
        if kind in m:
            sec, wall, r = (float(m[kind][key]) for key in ("seconds", "processSeconds", "rssMiB"))
            print(f"{name:<46}{sec:>9.1f}{sec / fwd:>13.2f}{wall:>11.1f}{wall / proc:>17.2f}{r:>14.0f}{r / rss:>13.2f}")
    for kind in ("calibrate", "calibrate-oneshot"):
        if kind not in m:
            continue
        steps = m[kind]["steps"]
        print(f"{MEASUREMENTS[kind]}, where the time goes: " + ", ".join(f"{k} {v:.1f}s" for k, v in steps.items()))


def ratio(measurements: dict[str, Any], kind: str, key: str, reference: float) -> str:
    return f"{float(measurements[kind][key]) / reference:.2f}" if kind in measurements else "-"


def print_summary(rows: list[dict[str, Any]]) -> None:
    print("\nsummary (x = ratio to the plain forward of the same row, measured side by side; process = spawn to exit)")
    columns = (
        ("eager oneshot x", "oneshot-eager", "seconds"),
        ("oneshot x", "oneshot", "seconds"),
        ("calibrate x", "calibrate", "seconds"),
        ("process x", "calibrate", "processSeconds"),
        ("RSS x", "calibrate", "rssMiB"),
        ("--oneshot x", "calibrate-oneshot", "seconds"),
        ("process x", "calibrate-oneshot", "processSeconds"),
        ("RSS x", "calibrate-oneshot", "rssMiB"),
    )
    header = "".join(f"{title:>16}" for title, _, _ in columns)
    print(f"{'row':<10}{'tokens/sample':>14}{'samples':>9}{'held out':>10}{'plain s':>9}{'process s':>11}{header}")
    for row in rows:
        m = row["measurements"]
        plain = m["plain"]
        held_out = f"{row['holdoutTokens'] / row['tokens']:.0%}"
        print(
            f"{row['label']:<10}{row['maxSeqLength']:>14}{row['samples']:>9}{held_out:>10}{float(plain['seconds']):>9.1f}"
            f"{float(plain['processSeconds']):>11.1f}"
            + "".join(f"{ratio(m, kind, key, float(plain[key])):>16}" for _, kind, key in columns)
        )


def oneshot_with_taps(
    model_dir: Path, samples: list[Sample], pipeline: str, observer: str
) -> tuple[float, dict[str, list[torch.Tensor]], Tap]:
    from kvcal.calibrator.attention import model_attention

    model = load(model_dir)
    tap = Tap(heads=3)
    handles = attach(model, tap)
    t = time.perf_counter()
    with model_attention(pipeline):
        run_oneshot(model, samples, "tensor", observer, pipeline)
    seconds = time.perf_counter() - t
    detach(handles)
    return seconds, read_scales(model), tap


def observed_over_true(scales: dict[str, list[torch.Tensor]], tap: Tap) -> dict[str, tuple[float, float]]:
    """scale * 448 / true max|x| over the same calibration tokens: (min, mean) over layers. < 1 means clipping."""
    out = {}
    for kind in ("k", "v"):
        r = torch.stack([s.max() * 448 / tap.observed[(i, kind)].absmax.max() for i, s in enumerate(scales[kind])])
        out[kind] = (float(r.min()), float(r.mean()))
    return out


def compare(config: CalibrationConfig, pipelines: bool, observers: bool) -> None:
    """In-process extras on the bundled row: pipelines (time, identical scales) and observers (clipping)."""
    torch.set_num_threads(threads())
    samples, _ = calibration_samples(config)
    if pipelines:
        basic_seconds, basic, _ = oneshot_with_taps(config.model_dir, samples, "basic", "static_minmax")
        seq_seconds, seq, _ = oneshot_with_taps(config.model_dir, samples, "sequential", "static_minmax")
        same = all(torch.equal(a, b) for kind in ("k", "v") for a, b in zip(basic[kind], seq[kind], strict=True))
        print(f"\noneshot basic {basic_seconds:.1f} s, sequential {seq_seconds:.1f} s; scales bit-identical: {same}")
    if observers:
        for observer in ("static_minmax", "minmax", "mse"):
            _, scales, tap = oneshot_with_taps(config.model_dir, samples, "basic", observer)
            kv = observed_over_true(scales, tap)
            print(
                f"observer {observer:<14} scale*448/true max  K min {kv['k'][0]:.3f} mean {kv['k'][1]:.3f}   "
                f"V min {kv['v'][0]:.3f} mean {kv['v'][1]:.3f}"
            )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=16, help="bundled prompts; 0: long rows only")
    ap.add_argument("--max-seq-length", type=int, default=512)
    ap.add_argument("--holdout-samples", type=int, default=4)
    ap.add_argument("--long-lengths", default="4096,8192", help="comma-separated tokens per sample; '' for none")
    ap.add_argument("--long-samples", type=int, default=1)
    ap.add_argument(
        "--eager-up-to", type=int, default=4096, help="the bare eager oneshot only on rows of at most this many tokens"
    )
    ap.add_argument("--eager", action="store_true", help="also `kvcal calibrate --oneshot` under eager attention")
    ap.add_argument("--compare-pipelines", action="store_true")
    ap.add_argument("--compare-observers", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    ap.add_argument("--measure", choices=sorted(MEASUREMENTS), help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.measure:
        print(json.dumps(measure(args.measure, CalibrationConfig.model_validate_json(args.config)), default=str))
        return 0
    model_dir = demo_model_dir()
    work = Path(tempfile.mkdtemp(prefix="kvcal-bench-"))
    common: dict[str, Any] = {"model_dir": model_dir, "pipeline": "basic", "plots": True, "force": True}
    configs: list[tuple[str, CalibrationConfig, list[str] | None]] = []
    if args.samples > 0:  # --samples 0: long rows only
        operator = operator_config(work / "operator", args.samples, args.max_seq_length)
        configs.append(("operator", operator, ["plain", "calibrate", "calibrate-oneshot"]))
        bundled = CalibrationConfig(
            data=CALIBRATION_SET,
            holdout_data=HOLDOUT_SET,
            out=work / "bundled",
            samples=args.samples,
            max_seq_length=args.max_seq_length,
            holdout_samples=args.holdout_samples,
            **common,
        )
        configs.append(("bundled", bundled, None))
    for length in [int(x) for x in args.long_lengths.split(",") if x.strip()]:
        long_row = CalibrationConfig(
            data=text_records(CALIBRATION_SET, length, args.long_samples, work / f"cal-{length}.jsonl"),
            holdout_data=text_records(HOLDOUT_SET, length // HOLDOUT_SHARE, 1, work / f"hold-{length}.jsonl"),
            out=work / f"long-{length}",
            samples=args.long_samples,
            max_seq_length=length,
            **common,
        )
        configs.append(("long", long_row, None))
    torch.set_num_threads(threads())
    print(cpu_line(), flush=True)
    rows = []
    for label, config, kinds in configs:
        print(f"row {label}: <= {config.max_seq_length} tokens per sample", flush=True)
        rows.append(run_row(config, args.eager, args.eager_up_to, label, kinds))
    for row in rows:
        print_row(row)
    print_summary(rows)
    if (args.compare_pipelines or args.compare_observers) and args.samples > 0:
        compare(configs[1][1], args.compare_pipelines, args.compare_observers)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
