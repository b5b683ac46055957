"""The Dockerfiles, parsed (no Docker engine here): pinned bases, a non-root final user, entrypoints that exist."""

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))
SCRIPTS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


@dataclass
class Stage:
    base: str
    alias: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def last(self, keyword: str) -> str | None:
        found = [arg for kw, arg in self.instructions if kw == keyword]
        return found[-1] if found else None


def parse(path: Path) -> list[Stage]:
    """Split into stages, joining continuation lines and substituting ARG defaults declared before FROM."""
    text = re.sub(r"\\\n", " ", path.read_text())
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), rest.split()[0])
            alias = rest.split()[2] if len(rest.split()) == 3 and rest.split()[1].upper() == "AS" else None
            stages.append(Stage(base=base, alias=alias))
        else:
            assert stages, f"{path}: {keyword} before the first FROM"
            stages[-1].instructions.append((keyword, rest))
    return stages


def is_pinned(image: str) -> bool:
    """name:tag with a real tag (not latest), or name@sha256:digest."""
    if re.search(r"@sha256:[0-9a-f]{64}$", image):
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest")


def exec_form(arg: str) -> list[str]:
    parsed = json.loads(arg)
    assert isinstance(parsed, list) and all(isinstance(a, str) for a in parsed), f"not exec form: {arg}"
    return parsed


def module_exists(module: str) -> bool:
    base = ROOT / "operator" / Path(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__main__.py").is_file() or (base / "__init__.py").is_file()


# Images whose entrypoint is not kvcal's: the vLLM CPU server of the local trial.
EXTERNAL_ENTRYPOINTS = {"vllm-cpu": ["vllm", "serve"]}


def test_every_image_has_a_dockerfile() -> None:
    assert {p.parent.name for p in DOCKERFILES} == {"operator", "calibrator", "verifier", "vllm-cpu"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_every_base_is_pinned(dockerfile: Path) -> None:
    stages = parse(dockerfile)
    aliases: set[str] = set()
    for stage in stages:
        if stage.base not in aliases:
            assert "$" not in stage.base, f"{dockerfile}: FROM {stage.base} has an ARG without a default"
            assert is_pinned(stage.base), f"{dockerfile}: FROM {stage.base} is not pinned to a tag or digest"
        if stage.alias:
            aliases.add(stage.alias)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_is_multi_stage_and_final_user_is_not_root(dockerfile: Path) -> None:
    stages = parse(dockerfile)
    assert len(stages) >= 2, f"{dockerfile}: expected a build stage and a runtime stage"
    user = stages[-1].last("USER")
    assert user is not None, f"{dockerfile}: the final stage sets no USER (it would run as root)"
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"{dockerfile}: USER {user} must be a numeric non-root UID"
    assert uid == "65532", "the chart's securityContext.runAsUser expects 65532"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_entrypoint_exists_in_the_package(dockerfile: Path) -> None:
    entrypoint = parse(dockerfile)[-1].last("ENTRYPOINT")
    assert entrypoint is not None, f"{dockerfile}: no ENTRYPOINT in the final stage"
    argv = exec_form(entrypoint)
    if dockerfile.parent.name in EXTERNAL_ENTRYPOINTS:
        assert argv == EXTERNAL_ENTRYPOINTS[dockerfile.parent.name]
        return
    if argv[0] in ("python", "python3"):
        assert argv[1] == "-m", argv
        assert module_exists(argv[2]), f"{dockerfile}: module {argv[2]} not found under operator/"
        return
    assert argv[0] in SCRIPTS, f"{dockerfile}: {argv[0]} is not a [project.scripts] console script"
    # `kvcal SUBCOMMAND`: the subcommand is registered, and its module exists.
    from kvcal.cli import SUBCOMMANDS

    assert argv[1] in SUBCOMMANDS, f"{dockerfile}: `kvcal {argv[1]}` is not a kvcal subcommand"
    module = SUBCOMMANDS[argv[1]][0]
    assert module_exists(module), f"{dockerfile}: {module} (kvcal {argv[1]}) not found under operator/"


def test_expected_entrypoints() -> None:
    entry = {p.parent.name: exec_form(parse(p)[-1].last("ENTRYPOINT") or "[]") for p in DOCKERFILES}
    assert entry == {
        "operator": ["kvcal", "operator", "run"],
        "calibrator": ["python", "-m", "kvcal.calibrator"],
        "verifier": ["kvcal", "verify"],
        **EXTERNAL_ENTRYPOINTS,
    }


def installs(dockerfile: Path) -> str:
    return " ".join(arg for stage in parse(dockerfile) for kw, arg in stage.instructions if kw == "RUN")


def test_operator_image_has_no_torch() -> None:
    runs = installs(IMAGES / "operator" / "Dockerfile")
    assert "pip install ." in runs and "[calibrator]" not in runs and "torch" not in runs.replace("import torch", "")


def test_calibrator_image_installs_the_calibrator_extra_on_cuda() -> None:
    dockerfile = IMAGES / "calibrator" / "Dockerfile"
    assert '.[calibrator]"' in installs(dockerfile)
    stages = parse(dockerfile)
    aliases = {s.alias for s in stages if s.alias}
    assert all(s.base.startswith("nvidia/cuda:") or s.base in aliases for s in stages)


def test_verifier_uses_the_pinned_vllm_image() -> None:
    final = parse(IMAGES / "verifier" / "Dockerfile")[-1]
    assert final.base == "vllm/vllm-openai:v0.32.0"
    assert "--no-deps" in installs(IMAGES / "verifier" / "Dockerfile")


@pytest.mark.parametrize(
    ("image", "pinned"),
    [
        ("python:3.11.14-slim", True),
        ("python", False),
        ("python:latest", False),
        ("localhost:5000/python", False),
        ("localhost:5000/python:3.11", True),
        ("python@sha256:" + "0" * 64, True),
    ],
)
def test_pin_rule(image: str, pinned: bool) -> None:
    assert is_pinned(image) is pinned
