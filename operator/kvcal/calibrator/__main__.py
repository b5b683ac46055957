"""The calibration Job's entrypoint: `python -m kvcal.calibrator --config FILE [--termination-log PATH]`.
Same code path as `kvcal calibrate --config FILE`."""

import argparse
import sys

from kvcal.calibrator.cli import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvcal.calibrator")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["calibrate", *(sys.argv[1:] if argv is None else argv)])
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
