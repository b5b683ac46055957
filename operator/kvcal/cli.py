"""`kvcal` command line. Each subcommand lives in its own module and is imported only when used, so `kvcal status`
never imports torch and `kvcal calibrate` never imports the Kubernetes client."""

import argparse
import importlib
import sys

# subcommand -> (module defining `register(subparsers)`, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "calibrate": ("kvcal.calibrator.cli", "calibrate FP8 KV-cache scales for a checkpoint (llm-compressor)"),
    "verify": ("kvcal.verify.cli", "check a calibrated checkpoint statically, or read its scales back from vLLM"),
    "compare": ("kvcal.compare.cli", "serve BF16 / FP8 default / FP8 calibrated on vLLM and compare them"),
    "validate": ("kvcal.validate", "lint KVCalibration YAML files offline with the API server's rules (CI)"),
    "operator": ("kvcal.handlers.cli", "run the operator against the current kubeconfig"),
    "status": ("kvcal.ctl", "show a KVCalibration as a tree: phase, steps, weights, measurements"),
    "promote": ("kvcal.ctl", "promote a KVCalibration waiting in AwaitingPromotion"),
    "abort": ("kvcal.ctl", "abort a KVCalibration: roll back the canary"),
    "retry": ("kvcal.ctl", "re-run the analysis of a rolled-back or failed KVCalibration"),
    "recalibrate": ("kvcal.ctl", "calibrate a finished KVCalibration anew (a spec change never restarts it)"),
    "plan": ("kvcal.sizing", "size a canary with the noise learned from the baseline's history (status.noise)"),
    "promotion-patch": ("kvcal.gitpatch", "print the promotion as a patch to commit to Git (Argo CD)"),
}


def build_parser(command: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvcal",
        description="Calibrate, verify and safely roll out FP8 KV-cache quantization on vLLM.",
        epilog="commands:\n" + "\n".join(f"  {name:<10} {summary}" for name, (_, summary) in SUBCOMMANDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    if command in SUBCOMMANDS:
        module = importlib.import_module(SUBCOMMANDS[command][0])
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    command = next((arg for arg in args_in if not arg.startswith("-")), None)
    parser = build_parser(command)
    args = parser.parse_args(args_in)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
