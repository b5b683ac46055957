"""spec.serving.canary.extraArgs on a real kube-apiserver: the CRD's CEL refuses every spelling of a flag kvcal owns
(issue #10: `--kv_cache_dtype=auto`, ` --kv-cache-dtype`, `--model=/etc`, `--calculate-kv-scales` were admitted),
names the item; --kv-cache-dtype-skip-layers too, since kvcal owns it (spec.serving.canary.protectedLayers). The
operator's model refuses the same items, and what CEL cannot judge ends in InvalidSpec."""

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from kvcal.adapters.kube import KubeClient
from kvcal.models.spec import KVCalibrationSpec
from kvcal.services.reconciler import Reconciler
from tests.support.cluster import Cluster
from tests.support.vllm_args import FREE_SPELLINGS, OWNED_SPELLINGS

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
MINIMAL = yaml.safe_load((REPO / "examples" / "minimal-per-tensor.yaml").read_text())


def _dry_run_create(cluster: Cluster, namespace: str, extra_args: list[str]) -> Any:
    doc = copy.deepcopy(MINIMAL)
    doc["metadata"]["name"] = "extra-args"
    doc["spec"]["serving"].setdefault("canary", {})["extraArgs"] = extra_args
    return cluster.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", "-o", "json", input=json.dumps(doc), check=False
    )


def _model_rejects(extra_args: list[str]) -> bool:
    spec = copy.deepcopy(MINIMAL["spec"])
    spec["serving"].setdefault("canary", {})["extraArgs"] = extra_args
    try:
        KVCalibrationSpec.model_validate(spec)
    except ValidationError:
        return True
    return False


# (extraArgs, index of the refused item, words of the message)
REFUSED = [
    *(([arg, "x"] if "=" not in arg else [arg], 0, "kvcal owns") for arg, _ in OWNED_SPELLINGS),
    ([" --kv-cache-dtype", "auto"], 0, "kvcal owns"),  # the reproductions of issue #10, verbatim
    (["--calculate-kv-scales"], 0, "kvcal owns"),
    (["--kv-cache-dtype-skip-layers", "0", "31"], 0, "protectedLayers"),
    (["--enforce-eager", "--", "/etc"], 1, "ends vLLM's options"),
]


@pytest.mark.parametrize(("extra_args", "index", "hint"), REFUSED, ids=[" ".join(r[0]) for r in REFUSED])
def test_owned_flag_in_extra_args_is_rejected_naming_the_item(
    control_plane: Cluster, crd_installed: str, extra_args: list[str], index: int, hint: str
) -> None:
    # After a harmless flag, so the message must name the right item, not just the list.
    proc = _dry_run_create(control_plane, "default", ["--max-num-seqs", "1", *extra_args])
    assert proc.returncode != 0, f"the API server admitted extraArgs {extra_args}"
    assert f"spec.serving.canary.extraArgs[{2 + index}]" in proc.stderr, proc.stderr
    assert hint in proc.stderr, proc.stderr
    assert _model_rejects(["--max-num-seqs", "1", *extra_args]), "the operator's model must refuse it too"


@pytest.mark.parametrize("extra_args", [["/etc"], [" /models/other", "--enforce-eager"]])
def test_leading_positional_is_rejected(control_plane: Cluster, crd_installed: str, extra_args: list[str]) -> None:
    proc = _dry_run_create(control_plane, "default", extra_args)
    assert proc.returncode != 0, f"the API server admitted extraArgs {extra_args}"
    assert "spec.serving.canary.extraArgs" in proc.stderr and "positional model" in proc.stderr, proc.stderr
    assert _model_rejects(extra_args)


ADMITTED = [
    ["--max-num-seqs", "1", "--enforce-eager", "-tp", "2", "-O3", "--compilation-config.mode=0"],
    ["--max-model-len=4096", "--kv-cache-memory-bytes", "1G", "--model-impl", "vllm", "--seed", "-1"],
    [],
    *(["--max-num-seqs", "1", arg] for arg in FREE_SPELLINGS),
]


@pytest.mark.parametrize("extra_args", ADMITTED, ids=[" ".join(a) or "empty" for a in ADMITTED])
def test_flags_kvcal_does_not_own_are_admitted(
    control_plane: Cluster, crd_installed: str, extra_args: list[str]
) -> None:
    proc = _dry_run_create(control_plane, "default", extra_args)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["spec"]["serving"]["canary"]["extraArgs"] == extra_args
    assert not _model_rejects(extra_args)


def test_operator_reports_invalid_spec_naming_the_item(
    control_plane: Cluster, crd_installed: str, namespace: str
) -> None:
    """What CEL cannot see (a value with no flag before it, after `--flag=value`) the operator refuses: one
    reconcile pass on the real API server writes InvalidSpec and names the item."""
    doc = copy.deepcopy(MINIMAL)
    doc["metadata"]["name"] = "positional"
    doc["spec"]["serving"].setdefault("canary", {})["extraArgs"] = ["--max-num-seqs=1", "/etc"]
    control_plane.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(doc))
    reconciler = Reconciler(KubeClient(control_plane.api_client()), lambda: datetime.now(UTC))
    reconciler.reconcile(namespace, "positional")
    status: Any = control_plane.get_json("kvcalibration", "positional", "-n", namespace)["status"]
    assert status["phase"] == "InvalidSpec", status
    assert "spec.serving.canary.extraArgs[1]: '/etc' is a positional argument" in status["message"], status
    assert not control_plane.kubectl("get", "jobs", "-n", namespace, "-o", "name").stdout.strip(), "nothing may run"
