"""`kvcal verify CHECKPOINT_DIR [--runtime] [--json] [--termination-log PATH]`, and the same without kvcal installed:
`python3 kvcal-verifier.pyz CHECKPOINT_DIR ...` (kvcal.verify.bundle, what the verification Job runs).

Exit 0 when the checkpoint is sound (and, with --runtime, vLLM really uses its scales); 1 with one line per problem
otherwise; 2 when the checkpoint cannot be read at all."""

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvcal.verify import static
from kvcal.verify.problems import Problem, termination_summary

DEFAULT_TERMINATION_LOG = Path("/dev/termination-log")
HELP = "check a calibrated checkpoint statically, or read its scales back from vLLM"
DESCRIPTION = (
    "Check that a checkpoint's FP8 K/V scales are present, sane and named so vLLM loads them; with --runtime, load it "
    "in vLLM and compare the scales vLLM really uses with the checkpoint's."
)


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("verify", help=HELP, description=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    """The verifier bundle's entry point (kvcal.verify.bundle): `python3 kvcal-verifier.pyz CHECKPOINT_DIR ...`."""
    parser = argparse.ArgumentParser(prog="kvcal-verifier.pyz", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", type=Path, metavar="CHECKPOINT_DIR")
    p.add_argument("--runtime", action="store_true", help="also load the checkpoint in vLLM and read the scales back")
    p.add_argument("--kv-cache-dtype", default="fp8", help="vLLM --kv-cache-dtype for --runtime (default: fp8)")
    p.add_argument("--attention-backend", default=None, help="vLLM attention backend for --runtime (default: vLLM's)")
    p.add_argument("--max-model-len", type=int, default=512, help="context length vLLM is started with (--runtime)")
    p.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="vLLM's tensor-parallel size for --runtime, the baseline's: every worker's scales are read back",
    )
    p.add_argument("--query-scales", action="store_true", help="require q_scale in every layer (and read it back)")
    p.add_argument(
        "--kv-cache-dtype-skip-layers",
        type=int,
        nargs="+",
        default=[],
        metavar="LAYER",
        help="layers vLLM keeps in BF16 (--runtime checks they are, and that the others are FP8)",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        metavar="PROMPTS",
        help="also run these prompts (JSONL, the calibration dataset's formats) through the checkpoint's BF16 weights "
        "and fail layers whose K/V clip under its scales or use a sliver of their range (needs torch + transformers)",
    )
    p.add_argument("--data-samples", type=int, default=32, help="prompts read from --data (default 32)")
    p.add_argument("--data-max-length", type=int, default=512, help="tokens per prompt for --data (default 512)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of lines")
    p.add_argument(
        "--termination-log",
        type=Path,
        default=None,
        help="write the <=4096-byte JSON summary here (default: /dev/termination-log when it exists)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        result = static.verify(args.checkpoint, args.query_scales)
    except (OSError, ValueError) as err:
        print(f"kvcal verify: {err}", file=sys.stderr)
        return 2
    problems: list[Problem] = list(result.problems)
    notes: list[str] = []
    mismatches = 0
    loaded: list[dict[str, Any]] = []
    on_data: dict[str, Any] | None = None
    if args.data is not None:
        from kvcal.verify import data

        try:
            on_prompts = data.check_data(
                args.checkpoint, result, args.data, samples=args.data_samples, max_length=args.data_max_length
            )
        except (OSError, ValueError) as err:
            print(f"kvcal verify --data: {err}", file=sys.stderr)
            return 2
        problems += on_prompts.problems
        notes.append(data.lines(on_prompts)[-1])
        on_data = on_prompts.to_json()
    if args.runtime:
        from kvcal.verify import runtime

        try:
            per_worker = runtime.read_back(
                args.checkpoint,
                args.kv_cache_dtype,
                args.attention_backend,
                args.max_model_len,
                args.kv_cache_dtype_skip_layers,
                args.tensor_parallel_size,
            )
        except Exception as err:  # any load failure is the verdict, and the Job must report it
            message = f"vLLM could not load the checkpoint: {type(err).__name__}: {err}"
            lines = [p.line() for p in problems] + [message]
            _write_termination(args.termination_log, termination_summary(False, result.shape.layers, 0, lines))
            print(message, file=sys.stderr)
            return 1
        outcome = runtime.compare_workers(
            result, per_worker, args.tensor_parallel_size, args.kv_cache_dtype, args.kv_cache_dtype_skip_layers
        )
        problems += outcome.problems
        notes += outcome.notes
        mismatches = outcome.mismatches
        loaded = [
            asdict(row) | {"layer": row.layer, "worker": worker}
            for worker, rows in enumerate(per_worker)
            for row in rows
        ]
    ok = not problems
    lines = [p.line() for p in problems]
    _write_termination(args.termination_log, termination_summary(ok, result.shape.layers, mismatches, lines, notes))
    if args.json:
        doc = {
            "ok": ok,
            "checkpoint": str(args.checkpoint),
            "strategy": result.strategy,
            "layers": result.shape.layers,
            "kvHeads": result.shape.kv_heads,
            "runtime": args.runtime,
            "tensorParallelSize": args.tensor_parallel_size,
            "mismatches": mismatches,
            "problems": [p.to_json() | {"line": p.line()} for p in problems],
            "notes": notes,
            "scales": {str(n): {"k": list(s.k), "v": list(s.v), "q": list(s.q)} for n, s in result.scales.items()},
            "protectedLayers": args.kv_cache_dtype_skip_layers,
            "loaded": loaded,
            "data": on_data,
        }
        print(json.dumps(doc, indent=1))
    else:
        for line in lines:
            print(line)
        for note in notes:
            print(f"note: {note}")
        workers = f" of {args.tensor_parallel_size} workers" if args.tensor_parallel_size > 1 else ""
        checked = f"checkpoint and vLLM read-back{workers}" if args.runtime else "checkpoint"
        checked += " and prompts" if args.data is not None else ""
        verdict = "OK" if ok else f"FAILED ({len(problems)} problems)"
        print(
            f"{verdict}: {checked}, {result.shape.layers} layers, strategy {result.strategy}, {mismatches} mismatches"
        )
    return 0 if ok else 1


def _write_termination(path: Path | None, text: str) -> None:
    target = path or (DEFAULT_TERMINATION_LOG if DEFAULT_TERMINATION_LOG.exists() else None)
    if target is not None:
        target.write_text(text)
