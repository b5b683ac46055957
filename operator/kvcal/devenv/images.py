"""Build kvcal's images from images/*/Dockerfile with podman (or buildah), and say which image and step broke.

    python -m kvcal.devenv.images build [operator calibrator vllm-cpu verifier] [--engine podman] [--pull never]

Prints a table of tag, size and build time. A failed build raises `ImageBuildError` naming the image and the
Dockerfile step that failed (podman's "STEP n/m: ..." line), with the last lines of the build log.
"""

import argparse
import re
import shutil
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
ENGINES = ("podman", "buildah")
LOG_TAIL_LINES = 30
# podman/buildah print "STEP 3/9: RUN ..." (multi-stage: "[1/2] STEP 3/9: RUN ...") before running each step.
STEP_LINE = re.compile(r"^(?:\[\d+/\d+\] )?STEP \d+/\d+: .*")


@dataclass(frozen=True)
class Image:
    name: str  # the folder under images/
    tag: str  # what the chart, the Jobs and docs/local-trial.md call it

    def dockerfile(self, repo: Path = REPO) -> Path:
        return repo / "images" / self.name / "Dockerfile"


# Build order: the verifier's base (vllm/vllm-openai) is the last to be needed.
IMAGES: dict[str, Image] = {
    image.name: image
    for image in (
        Image("operator", "ghcr.io/kvcal/kvcal-operator:0.1.0"),
        Image("calibrator", "ghcr.io/kvcal/kvcal-calibrator:0.1.0"),
        Image("vllm-cpu", "docker.io/kvcal/vllm-cpu:0.32.0"),
        Image("verifier", "ghcr.io/kvcal/kvcal-verifier:0.1.0"),
    )
}


class ImageBuildError(RuntimeError):
    def __init__(self, image: str, step: str | None, returncode: int, tail: Sequence[str]) -> None:
        self.image, self.step, self.returncode, self.tail = image, step, returncode, list(tail)
        where = f"at {step}" if step else "before its first step"
        super().__init__(
            f"image {image}: build failed {where} (exit {returncode}); last lines:\n" + "\n".join(self.tail)
        )


@dataclass(frozen=True)
class Built:
    image: Image
    seconds: float
    size_bytes: int


def build_command(
    engine: str, dockerfile: Path, tag: str, context: Path, pull: str, build_args: Sequence[str] = ()
) -> list[str]:
    # BuildKit reads <Dockerfile>.dockerignore by itself; podman and buildah are told.
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    verb = ["build"] if engine == "podman" else ["bud"]
    argv = [engine, *verb, "--layers", f"--pull={pull}", "-f", str(dockerfile), "-t", tag]
    if ignore.is_file():
        argv += ["--ignorefile", str(ignore)]
    for arg in build_args:
        argv += ["--build-arg", arg]
    return [*argv, str(context)]


def run_build(
    name: str, argv: Sequence[str], log: Path | None = None, echo: bool = False, env: Mapping[str, str] | None = None
) -> None:
    """Run one build, remembering the last step started; raise ImageBuildError naming it when the build fails."""
    step: str | None = None
    tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
    popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=env)
    with popen as proc:
        assert proc.stdout is not None
        with open(log or "/dev/null", "a") as sink:
            for line in proc.stdout:
                sink.write(line)
                if echo:
                    sys.stdout.write(line)
                stripped = line.rstrip("\n")
                tail.append(stripped)
                if STEP_LINE.match(stripped):
                    step = stripped
    if proc.returncode != 0:
        raise ImageBuildError(name, step, proc.returncode, tail)


def image_size(engine: str, tag: str, env: Mapping[str, str] | None = None) -> int:
    fmt = "{{.Size}}"
    argv = [engine, "image", "inspect", "--format", fmt, tag]
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    return int(out.stdout.strip() or 0) if out.returncode == 0 else 0


def build(
    image: Image,
    engine: str = "podman",
    pull: str = "missing",
    repo: Path = REPO,
    dockerfile: Path | None = None,
    log: Path | None = None,
    echo: bool = False,
    env: Mapping[str, str] | None = None,
) -> Built:
    started = time.monotonic()
    argv = build_command(engine, dockerfile or image.dockerfile(repo), image.tag, repo, pull)
    run_build(image.name, argv, log, echo, env)
    return Built(image, time.monotonic() - started, image_size(engine, image.tag, env))


def table(built: Sequence[Built]) -> str:
    rows = [f"{'image':<11} {'tag':<40} {'size':>9} {'build':>8}"]
    rows += [f"{b.image.name:<11} {b.image.tag:<40} {b.size_bytes / 1e6:>7.0f}MB {b.seconds:>7.1f}s" for b in built]
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvcal.devenv.images")
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("build", help="build images (default: all, in dependency order)")
    cmd.add_argument("names", nargs="*", metavar="NAME", help=f"of {', '.join(IMAGES)}")
    cmd.add_argument("--engine", choices=ENGINES, default="podman")
    cmd.add_argument("--pull", choices=("missing", "never", "always", "newer"), default="missing")
    cmd.add_argument("--quiet", "-q", action="store_true", help="print only the table (and a failure)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(IMAGES))
    if unknown:
        parser.error(f"unknown image(s) {', '.join(unknown)}; known: {', '.join(IMAGES)}")
    if shutil.which(args.engine) is None:
        print(f"{args.engine} not found (Debian: apt-get install {args.engine}; here: make oci)", file=sys.stderr)
        return 2
    built = []
    try:
        for name in args.names or IMAGES:
            built.append(build(IMAGES[name], args.engine, args.pull, echo=not args.quiet))
    except ImageBuildError as error:
        print(f"\n{error}", file=sys.stderr)
        return 1
    finally:
        print(table(built))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
