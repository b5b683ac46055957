"""`kvcal calibrate` and `python -m kvcal.calibrator --config FILE`: both build a CalibrationConfig and call main()."""

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kvcal.calibrator.config import DEFAULT_TERMINATION_LOG, CalibrationConfig
from kvcal.core.manifests.jobs import DEADLINE_ENV

log = logging.getLogger("kvcal.calibrator")

# The demo is sized to finish in a few minutes on 2 CPU cores (one long document among short chats).
DEMO_SAMPLES = 10
DEMO_MAX_SEQ_LENGTH = 512
DEMO_HOLDOUT_SAMPLES = 5


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser(
        "calibrate",
        help="calibrate FP8 KV-cache scales for a checkpoint (llm-compressor)",
        description="Calibrate FP8 (E4M3) KV-cache scales with llm-compressor, save the checkpoint with "
        "k_scale/v_scale and write kvcal-report.json, report.md and plots that compare BF16, FP8 scale 1.0, FP8 "
        "calibrated per tensor and FP8 calibrated per head on the same held-out data, with KV bytes per token and the "
        "calibration data's length coverage against the served context.",
    )
    p.add_argument("model_dir", nargs="?", type=Path, help="BF16 Hugging Face checkpoint folder")
    p.add_argument("--data", type=Path, help="JSONL file or folder ({'messages': [...]} or {'text': ...} per line)")
    p.add_argument("--holdout-data", type=Path, help="separate held-out JSONL (default: split --data)")
    p.add_argument("--out", type=Path, help="output folder for the calibrated checkpoint and report")
    p.add_argument(
        "--strategy", choices=["tensor", "head"], help=_help("strategy", "one scale per layer, or per KV head")
    )
    p.add_argument(
        "--observer", choices=["static-minmax", "minmax", "mse"], help=_help("observer", "llm-compressor observer")
    )
    p.add_argument("--samples", type=int, help=_help("samples", "calibration samples"))
    p.add_argument(
        "--max-seq-length", type=int, help=_help("max_seq_length", "truncate longer samples (counted in the report)")
    )
    p.add_argument(
        "--max-model-len", type=int, help=_help("max_model_len", "longest context served, for the length coverage")
    )
    p.add_argument(
        "--holdout-fraction",
        type=float,
        help=_help("holdout_fraction", "share of the samples used that is held out (split off --data)"),
    )
    p.add_argument("--holdout-samples", type=int, help=_help("holdout_samples", "held-out samples scored"))
    p.add_argument("--seed", type=int, help=_help("seed", "split and sampling seed"))
    p.add_argument(
        "--pipeline", choices=["auto", "basic", "sequential"], help=_help("pipeline", "llm-compressor pipeline")
    )
    p.add_argument(
        "--rounding", choices=["nearest", "toward-zero"], help=_help("rounding", "FP8 rounding emulated in the report")
    )
    p.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        help=_help("device", "cuda: the visible GPUs (one, several, or layer by layer); cpu for trials"),
    )
    p.add_argument(
        "--deadline-seconds",
        type=int,
        help=_help("deadline_seconds", "refuse, before the model loads, a calibration estimated to need longer"),
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG heatmaps")
    p.add_argument("--query-scales", action="store_true", help="also calibrate q_scale (FP8 attention backends)")
    p.add_argument(
        "--oneshot",
        action="store_true",
        help="run llm-compressor's oneshot even where one plain forward pass gives the same checkpoint (slower)",
    )
    p.add_argument("--config", type=Path, help="CalibrationConfig JSON file (flags given here override it)")
    p.add_argument(
        "--demo",
        action="store_true",
        help=f"SmolLM2-135M-Instruct and the bundled calibration set ({DEMO_SAMPLES} samples, max seq length "
        f"{DEMO_MAX_SEQ_LENGTH}, {DEMO_HOLDOUT_SAMPLES} held-out samples unless given)",
    )
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.add_argument("--json", action="store_true", help="print the summary JSON instead of the table")
    p.add_argument(
        "--termination-log", type=Path, help=f"summary JSON path (default: {DEFAULT_TERMINATION_LOG} if present)"
    )
    p.set_defaults(func=run_cli)


def _help(field: str, text: str) -> str:
    """`text (default: X)` with X from CalibrationConfig: the flags default to None so a --config file is not
    overridden, which would make argparse's own default display say None."""
    info = CalibrationConfig.model_fields[field]
    shown = info.default
    if shown is None:  # "None" says nothing: the description's "default: ..." says what happens
        shown = (info.description or "").partition("default: ")[2].rstrip(")") or "all"
    return f"{text} (default: {shown})"


FLAG_FIELDS = (
    "data",
    "holdout_data",
    "out",
    "strategy",
    "observer",
    "samples",
    "max_seq_length",
    "max_model_len",
    "holdout_fraction",
    "holdout_samples",
    "seed",
    "pipeline",
    "rounding",
    "device",
    "deadline_seconds",
    "termination_log",
)


def config_from_args(args: argparse.Namespace) -> CalibrationConfig:
    values: dict[str, Any] = {}
    if args.config:
        values = dict(load_config_file(args.config))
    if args.demo:
        from kvcal.demo import CALIBRATION_SET, HOLDOUT_SET, demo_model_dir

        values.update(
            modelDir=demo_model_dir(),
            data=CALIBRATION_SET,
            holdoutData=HOLDOUT_SET,
            samples=DEMO_SAMPLES,
            maxSeqLength=DEMO_MAX_SEQ_LENGTH,
            holdoutSamples=DEMO_HOLDOUT_SAMPLES,
        )
    if args.model_dir is not None:
        values["modelDir"] = args.model_dir
    # The Job passes its activeDeadlineSeconds in the environment (core/manifests/jobs.py says why).
    if os.environ.get(DEADLINE_ENV):
        values["deadlineSeconds"] = os.environ[DEADLINE_ENV]
    for name in FLAG_FIELDS:
        v = getattr(args, name)
        if v is not None:
            values[CalibrationConfig.model_fields[name].alias or name] = v
    if args.force:
        values["force"] = True
    if args.no_plots:
        values["plots"] = False
    if args.query_scales:
        values["queryScales"] = True
    if args.oneshot:
        values["oneshot"] = True
    missing = [f for f, a in (("MODEL_DIR", "modelDir"), ("--data", "data"), ("--out", "out")) if a not in values]
    if missing:
        raise UsageError(f"missing {', '.join(missing)} (or use --demo, or --config FILE)")
    return CalibrationConfig.model_validate(values)


class UsageError(ValueError):
    pass


def load_config_file(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"config {path}: cannot read JSON ({e})") from e
    if not isinstance(raw, dict):
        raise UsageError(f"config {path}: expected a JSON object")
    return raw


def describe_validation(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "config"
        parts.append(f"{loc}: {err['msg']}")
    return "invalid calibration config: " + "; ".join(parts)


def termination_path(config: CalibrationConfig | None, explicit: Path | None) -> Path | None:
    if explicit is not None:
        return explicit
    if config is not None and config.termination_log is not None:
        return config.termination_log
    return DEFAULT_TERMINATION_LOG if DEFAULT_TERMINATION_LOG.exists() else None


def setup_runtime() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    threads = os.environ.get("KVCAL_THREADS")
    if threads:
        import torch

        torch.set_num_threads(int(threads))


def run_cli(args: argparse.Namespace) -> int:
    setup_runtime()
    config: CalibrationConfig | None = None
    try:
        config = config_from_args(args)
    except ValidationError as e:
        return fail(describe_validation(e), 2, termination_path(None, args.termination_log))
    except Exception as e:  # UsageError, DemoUnavailable, a failed demo conversion
        return fail(str(e), 2, termination_path(None, args.termination_log))
    return execute(config, as_json=args.json, termination_log=termination_path(config, args.termination_log))


def execute(config: CalibrationConfig, as_json: bool, termination_log: Path | None) -> int:
    from kvcal.calibrator.data import DatasetError
    from kvcal.calibrator.preflight import InputError
    from kvcal.calibrator.report import comparison_table, coverage_line, device_line, summary_json
    from kvcal.calibrator.run import calibrate

    try:
        report = calibrate(config)
    except (InputError, DatasetError) as e:
        return fail(str(e), 2, termination_log)
    except Exception as e:
        log.exception("calibration failed")
        return fail(f"calibration failed: {type(e).__name__}: {e}", 1, termination_log)
    text = summary_json(report.summary)
    if termination_log is not None:
        termination_log.write_text(text, encoding="utf-8")
    if as_json:
        print(text)
    else:
        print(f"\nCalibrated checkpoint: {config.out}  (report: {config.out / 'report.md'})")
        print(
            f"strategy {config.strategy}, observer {config.observer}, {report.summary.samples} samples / "
            f"{report.summary.tokens} tokens; holdout {report.provenance.holdout_samples} samples / "
            f"{report.end_to_end.tokens} tokens scored\n"
        )
        print(comparison_table(report))
        print("\n" + coverage_line(report))
        if report.device:
            print("\n" + device_line(report.device))
        print("\nTimings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in report.timings_seconds.items()))
    return 0


def fail(message: str, rc: int, termination_log: Path | None) -> int:
    from kvcal.calibrator.report import error_json

    print(f"kvcal calibrate: error: {message}", file=sys.stderr)
    if termination_log is not None:
        try:
            termination_log.write_text(error_json(message), encoding="utf-8")
        except OSError as e:
            print(f"kvcal calibrate: cannot write {termination_log}: {e}", file=sys.stderr)
    return rc
