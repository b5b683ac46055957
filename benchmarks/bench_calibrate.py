"""Benchmark `kvcal calibrate` on the demo model against a plain BF16 forward pass over exactly the same tokens and
a bare llm-compressor `oneshot`, all in one process; optionally measure basic vs sequential pipelines and observers.

    python benchmarks/bench_calibrate.py [--samples 16] [--max-seq-length 512] [--holdout-samples 4]
                                         [--compare-pipelines] [--compare-observers]
"""

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from kvcal.calibrator.config import CalibrationConfig
from kvcal.calibrator.data import Sample
from kvcal.calibrator.recipe import read_scales, run_oneshot
from kvcal.calibrator.run import calibrate, plan_data
from kvcal.calibrator.taps import Tap, attach, detach
from kvcal.demo import CALIBRATION_SET, HOLDOUT_SET, demo_model_dir


def load(model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    return model.eval()


def plain_forward(model: torch.nn.Module, samples: list[Sample]) -> float:
    t = time.perf_counter()
    with torch.no_grad():
        for s in samples:
            model(torch.tensor([s.input_ids]))
    return time.perf_counter() - t


def oneshot_with_taps(
    model_dir: Path, samples: list[Sample], pipeline: str, observer: str
) -> tuple[float, dict[str, list[torch.Tensor]], Tap]:
    model = load(model_dir)
    tap = Tap(heads=3)
    handles = attach(model, tap)
    t = time.perf_counter()
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--max-seq-length", type=int, default=512)
    ap.add_argument("--holdout-samples", type=int, default=4)
    ap.add_argument("--compare-pipelines", action="store_true")
    ap.add_argument("--compare-observers", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(int(os.environ.get("KVCAL_THREADS", "2")))
    model_dir = demo_model_dir()
    out = Path(tempfile.mkdtemp(prefix="kvcal-bench-"))
    config = CalibrationConfig(
        model_dir=model_dir,
        data=CALIBRATION_SET,
        holdout_data=HOLDOUT_SET,
        out=out / "ckpt",
        samples=args.samples,
        max_seq_length=args.max_seq_length,
        holdout_samples=args.holdout_samples,
        pipeline="basic",
        plots=True,
    )
    from transformers import AutoTokenizer

    plan = plan_data(config, AutoTokenizer.from_pretrained(model_dir))
    cal_tokens = sum(len(s.input_ids) for s in plan.calibration)
    hold_tokens = sum(len(s.input_ids) for s in plan.holdout)
    r: dict[str, object] = {"samples": len(plan.calibration), "tokens": cal_tokens, "holdoutTokens": hold_tokens}
    model = load(model_dir)
    plain_forward(model, plan.calibration[:1])  # warm-up
    r["plainForward"] = plain_forward(model, plan.calibration)
    r["plainForwardHoldout"] = plain_forward(model, plan.holdout)
    del model
    t = time.perf_counter()
    bare = load(model_dir)
    run_oneshot(bare, plan.calibration, "tensor", "static_minmax", "basic")
    r["bareOneshotBasic"] = time.perf_counter() - t
    basic_scales = read_scales(bare)
    del bare
    report = calibrate(config)
    r["kvcalCalibrate"] = report.summary.duration_seconds
    r["kvcalSteps"] = report.timings_seconds
    model = load(model_dir)  # again: a shared machine's load drifts, the smaller of the two is the reference
    r["plainForwardAgain"] = plain_forward(model, plan.calibration)
    r["plainForwardHoldoutAgain"] = plain_forward(model, plan.holdout)
    del model
    if args.compare_pipelines:
        seconds, seq_scales, _ = oneshot_with_taps(model_dir, plan.calibration, "sequential", "static_minmax")
        r["oneshotSequential"] = seconds
        r["sequentialScalesEqualBasic"] = all(
            torch.equal(a, b) for kind in ("k", "v") for a, b in zip(basic_scales[kind], seq_scales[kind], strict=True)
        )
    if args.compare_observers:
        ratios = {}
        for observer in ("static_minmax", "minmax", "mse"):
            _, scales, tap = oneshot_with_taps(model_dir, plan.calibration, "basic", observer)
            ratios[observer] = observed_over_true(scales, tap)
        r["observerScaleOverTrueMax"] = ratios
    fwd = min(float(r["plainForward"]), float(r["plainForwardAgain"]))  # type: ignore[arg-type]
    both = fwd + min(float(r["plainForwardHoldout"]), float(r["plainForwardHoldoutAgain"]))  # type: ignore[arg-type]
    print(f"plain forward before/after: {r['plainForward']:.1f} s / {r['plainForwardAgain']:.1f} s")
    print(
        f"\n{r['samples']} calibration samples / {cal_tokens} tokens, holdout {hold_tokens} tokens, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"{'step':<38}{'seconds':>10}{'x plain fwd':>14}{'x fwd cal+holdout':>20}")
    rows = [
        ("plain BF16 forward (calibration)", fwd),
        ("bare oneshot (basic pipeline)", r["bareOneshotBasic"]),
        ("kvcal calibrate (all, with report)", r["kvcalCalibrate"]),
    ]
    if "oneshotSequential" in r:
        rows.append(("oneshot sequential (with taps)", r["oneshotSequential"]))
    for name, sec in rows:
        s = float(sec)  # type: ignore[arg-type]
        print(f"{name:<38}{s:>10.1f}{s / fwd:>14.2f}{s / both:>20.2f}")
    print(
        "kvcal calibrate, where the time goes: " + ", ".join(f"{k} {v:.1f}s" for k, v in report.timings_seconds.items())
    )
    if "sequentialScalesEqualBasic" in r:
        print(f"sequential scales bit-identical to basic: {r['sequentialScalesEqualBasic']}")
    if "observerScaleOverTrueMax" in r:
        for obs, kv in r["observerScaleOverTrueMax"].items():  # type: ignore[attr-defined]
            print(
                f"observer {obs:<14} scale*448/true max  K min {kv['k'][0]:.3f} mean {kv['k'][1]:.3f}   "
                f"V min {kv['v'][0]:.3f} mean {kv['v'][1]:.3f}"
            )
    if args.json:
        args.json.write_text(json.dumps(r, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
