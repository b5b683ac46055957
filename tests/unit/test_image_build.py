"""kvcal.devenv.images without an engine: the build command line, and a failure naming the image and the last step
(the engine stood in for by a shell printing podman's step lines; tests/images builds a real broken Dockerfile)."""

from pathlib import Path

import pytest
import yaml

from kvcal.devenv.images import IMAGES, REPO, ImageBuildError, build_command, run_build

FAKE_PODMAN = """
echo '[1/2] STEP 1/3: FROM python:3.11.14-slim-bookworm AS build'
echo '[1/2] STEP 2/3: RUN pip install .'
echo 'ERROR: Directory . is not installable'
exit 7
"""


def test_a_failed_build_names_the_image_and_the_last_step() -> None:
    with pytest.raises(ImageBuildError) as failure:
        run_build("operator", ["bash", "-c", FAKE_PODMAN])
    error = failure.value
    assert (error.image, error.step, error.returncode) == ("operator", "[1/2] STEP 2/3: RUN pip install .", 7)
    assert str(error).startswith("image operator: build failed at [1/2] STEP 2/3: RUN pip install . (exit 7)")
    assert error.tail[-1] == "ERROR: Directory . is not installable"


def test_a_build_that_fails_before_its_first_step_says_so() -> None:
    with pytest.raises(ImageBuildError, match="image verifier: build failed before its first step"):
        run_build("verifier", ["bash", "-c", "echo 'Error: no context'; exit 125"])


def test_build_command_passes_the_dockerignore_and_never_pulls_when_told() -> None:
    dockerfile = IMAGES["operator"].dockerfile()
    argv = build_command("podman", dockerfile, "t:1", REPO, "never")
    assert argv[:2] == ["podman", "build"] and "--pull=never" in argv and argv[-1] == str(REPO)
    assert argv[argv.index("--ignorefile") + 1] == str(dockerfile.with_name("Dockerfile.dockerignore"))
    assert build_command("buildah", dockerfile, "t:1", REPO, "missing")[:2] == ["buildah", "bud"]


def test_the_tags_are_what_the_chart_and_the_local_trial_run() -> None:
    chart = yaml.safe_load((REPO / "charts" / "kvcal" / "Chart.yaml").read_text())
    values = yaml.safe_load((REPO / "charts" / "kvcal" / "values.yaml").read_text())
    assert IMAGES["operator"].tag == f"{values['image']['repository']}:{chart['appVersion']}"
    assert IMAGES["calibrator"].tag == values["jobImages"]["calibrator"]
    trial = (REPO / "docs" / "local-trial" / "smollm2.yaml").read_text()
    assert "image: " + IMAGES["vllm-cpu"].tag.removeprefix("docker.io/") in trial


def test_every_image_folder_is_built() -> None:
    assert set(IMAGES) == {p.parent.name for p in Path(REPO / "images").glob("*/Dockerfile")}
