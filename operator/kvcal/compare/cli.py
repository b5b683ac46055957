"""`kvcal compare MODEL_DIR CALIBRATED_DIR [--holdout FILE] [--out DIR]` and `kvcal compare --demo`."""

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kvcal.compare import report, run, workload

DEMO_CALIBRATED = Path("out/demo")


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser(
        "compare",
        help="serve BF16 / FP8 default / FP8 calibrated on vLLM and compare them",
        description="Serve the model with BF16 KV, FP8 KV at scale 1.0, and FP8 KV with the calibrated scales (and "
        "per-head where the backend supports it) on real vLLM, one after the other, and compare them on the same "
        "greedy workload: prompt-logprob deltas and top-1 agreement vs BF16 on held-out text, probe exact match, "
        "needle-in-a-haystack up to the context limit, KV-cache capacity and latency.",
    )
    p.add_argument("model", type=Path, nargs="?", metavar="MODEL_DIR", help="the BF16 model folder")
    p.add_argument("calibrated", type=Path, nargs="?", metavar="CALIBRATED_DIR", help="the calibrated checkpoint")
    p.add_argument("--demo", action="store_true", help="the embedded SmolLM2 demo (calibrates it first if needed)")
    p.add_argument("--per-head", type=Path, default=None, metavar="DIR", help="a per-head calibrated checkpoint")
    p.add_argument("--holdout", type=Path, default=None, metavar="FILE", help="JSON lines with text or messages")
    p.add_argument("--holdout-samples", type=int, default=16, help="held-out samples scored (default 16)")
    p.add_argument("--max-model-len", type=int, default=8192, help="context served (capped at the model's limit)")
    p.add_argument("--compile", action="store_true", help="let vLLM torch.compile (slower start-up, closer to prod)")
    p.add_argument("--out", type=Path, default=Path("out/compare"), help="folder for compare.json, compare.md, logs")
    p.set_defaults(func=main)


def _model_limit(model: Path) -> int | None:
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    text = config.get("text_config") or config
    limit = text.get("max_position_embeddings")
    return int(limit) if isinstance(limit, int) else None


def _demo_dirs() -> tuple[Path, Path]:
    from kvcal.demo import demo_model_dir

    model = demo_model_dir()
    if not (DEMO_CALIBRATED / "config.json").is_file():
        print(f"kvcal compare: no calibrated demo checkpoint in {DEMO_CALIBRATED}: running kvcal calibrate --demo")
        cmd = [sys.executable, "-m", "kvcal", "calibrate", "--demo", "--out", str(DEMO_CALIBRATED)]
        subprocess.run(cmd, check=True)
    return model, DEMO_CALIBRATED


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the progress
    if args.demo:
        model, calibrated = _demo_dirs()
    elif args.model is None or args.calibrated is None:
        print("kvcal compare: give MODEL_DIR and CALIBRATED_DIR, or --demo", file=sys.stderr)
        return 2
    else:
        model, calibrated = args.model, args.calibrated
    for label, folder in (("MODEL_DIR", model), ("CALIBRATED_DIR", calibrated)):
        if not (folder / "config.json").is_file():
            print(f"kvcal compare: {label} {folder} has no config.json (a Hugging Face model folder?)", file=sys.stderr)
            return 2
    limit = _model_limit(model)
    max_model_len = min(args.max_model_len, limit) if limit else args.max_model_len
    where = run.platform()
    variants = run.plan(model, calibrated, args.per_head, where, run.fp8_kv_missing())
    holdout = workload.load_holdout(args.holdout, max_chars=max_model_len * 2, limit=args.holdout_samples)
    probe_set = workload.probes(max_model_len)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()

    def progress(row: dict[str, Any]) -> None:
        print(f"[{time.time() - started:.0f}s] {row['name']}: {row['status']}", flush=True)

    rows = run.compare(
        variants, holdout, probe_set, max_model_len, args.out / "logs", not args.compile, on_row=progress
    )
    context = [
        f"model: {model}",
        f"calibrated: {calibrated}",
        f"vLLM platform: {where}; max model len {max_model_len}; {'compiled' if args.compile else 'eager'}",
        f"held-out samples: {len(holdout)}; probes: {len(probe_set)} (greedy)",
    ]
    doc = {"model": str(model), "calibrated": str(calibrated), "platform": where, "maxModelLen": max_model_len,
           "holdoutSamples": len(holdout), "configs": rows}  # fmt: skip
    (args.out / "compare.json").write_text(json.dumps(doc, indent=1))
    (args.out / "compare.md").write_text(report.markdown(rows, "kvcal compare", context))
    print(report.table(rows))
    print(f"\nwrote {args.out / 'compare.json'} and {args.out / 'compare.md'} ({time.time() - started:.0f}s)")
    return 0 if all(r["status"] == "ok" or r["status"].startswith("skipped") for r in rows) else 1
