"""The chart's PrometheusRule alerts, evaluated by promtool on synthetic series (`promtool test rules`), and the
dashboard's queries parsed by promtool as recording rules: real PromQL, real evaluation."""

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.observability import dashboard_exprs, prometheus_rule
from tests.support.prereq import require

pytestmark = pytest.mark.prometheus

GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$__range": "6h",
    "$__interval": "1m",
    "$namespace": "serving",
    "$baseline": "llama-bf16",
    "$canary": "llama-canary",
}


def promtool() -> str:
    found = shutil.which("promtool")
    require(found, "promtool not installed: run `make prometheus`")
    assert found is not None
    return found


def rules_file(tmp_path: Path, values: dict[str, str]) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": prometheus_rule(values)["spec"]["groups"]}))
    return path


def run_promtool_tests(tmp_path: Path, rules: Path, tests: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    spec = tmp_path / "tests.yaml"
    # Each test group needs its own sample interval: promtool does not default it to evaluation_interval.
    groups = [{"interval": "1m", **t} for t in tests]
    spec.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": groups}))
    return subprocess.run([promtool(), "test", "rules", str(spec)], capture_output=True, text=True, timeout=60)


def annotations(rules: Path, alert: str, summary: str) -> dict[str, str]:
    """The alert's annotations as promtool will render them: the static description, and the expected summary."""
    rule = next(r for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"] if r.get("alert") == alert)
    return {"summary": summary, "description": rule["annotations"]["description"]}


def objects(phase: str, values: str) -> dict[str, str]:
    return {"series": f'kvcal_objects{{phase="{phase}", job="kvcal"}}', "values": values}


def left(phase: str, values: str) -> dict[str, str]:
    return {"series": f'kvcal_phase_duration_seconds_count{{phase="{phase}", job="kvcal"}}', "values": values}


def test_rules_pass_promtool_check(tmp_path: Path) -> None:
    proc = subprocess.run(
        [promtool(), "check", "rules", str(rules_file(tmp_path, {}))], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_stuck_phase_fires_only_when_nothing_leaves_the_phase(tmp_path: Path) -> None:
    rules = rules_file(tmp_path, {"prometheusRule.stuckPhaseMinutes": "30"})
    stuck_labels = {
        "alertname": "KVCalibrationPhaseStuck",
        "severity": "warning",
        "phase": "Calibrating",
        "job": "kvcal",
    }
    tests = [
        {  # An object enters Calibrating at 30m and stays; nothing leaves Calibrating: fires 30 minutes later.
            "input_series": [objects("Calibrating", "0x29 1x60"), objects("Succeeded", "0x90")],
            "alert_rule_test": [
                {"eval_time": "50m", "alertname": "KVCalibrationPhaseStuck", "exp_alerts": []},
                {
                    "eval_time": "65m",
                    "alertname": "KVCalibrationPhaseStuck",
                    "exp_alerts": [
                        {
                            "exp_labels": stuck_labels,
                            "exp_annotations": annotations(
                                rules,
                                "KVCalibrationPhaseStuck",
                                "A KVCalibration has been Calibrating for over 30 minutes",
                            ),
                        }
                    ],
                },
            ],
        },
        {  # Objects keep passing through Calibrating (one leaves every 10 minutes): not stuck.
            "input_series": [objects("Calibrating", "0x29 1x60"), left("Calibrating", "0+0.1x90")],
            "alert_rule_test": [{"eval_time": "65m", "alertname": "KVCalibrationPhaseStuck", "exp_alerts": []}],
        },
        {  # Waiting for a human is not stuck.
            "input_series": [objects("AwaitingPromotion", "0x29 1x60")],
            "alert_rule_test": [{"eval_time": "80m", "alertname": "KVCalibrationPhaseStuck", "exp_alerts": []}],
        },
    ]
    proc = run_promtool_tests(tmp_path, rules, tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_repeated_rollbacks_fire_at_the_threshold(tmp_path: Path) -> None:
    rules = rules_file(tmp_path, {"prometheusRule.rollbackThreshold": "2", "prometheusRule.rollbackWindow": "1h"})
    tests = [
        {  # First rollback at 10m, second at 30m.
            "input_series": [left("RollingBack", "0x9 1x20 2x20")],
            "alert_rule_test": [
                {"eval_time": "20m", "alertname": "KVCalibrationRepeatedRollbacks", "exp_alerts": []},
                {
                    "eval_time": "40m",
                    "alertname": "KVCalibrationRepeatedRollbacks",
                    "exp_alerts": [
                        {
                            "exp_labels": {"alertname": "KVCalibrationRepeatedRollbacks", "severity": "warning"},
                            "exp_annotations": annotations(
                                rules, "KVCalibrationRepeatedRollbacks", "2 KVCalibration rollbacks in 1h"
                            ),
                        }
                    ],
                },
            ],
        }
    ]
    proc = run_promtool_tests(tmp_path, rules, tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_reconcile_errors_fire_when_sustained(tmp_path: Path) -> None:
    rules = rules_file(tmp_path, {"prometheusRule.reconcileErrorRate": "0.05"})
    series = {"series": 'kvcal_reconciles_total{result="error", job="kvcal"}', "values": "0+6x60"}  # 0.1/s
    ok = {"series": 'kvcal_reconciles_total{result="ok", job="kvcal"}', "values": "0+60x60"}
    tests = [
        {
            "input_series": [series, ok],
            "alert_rule_test": [
                {"eval_time": "15m", "alertname": "KVCalibrationReconcileErrors", "exp_alerts": []},
                {
                    "eval_time": "30m",
                    "alertname": "KVCalibrationReconcileErrors",
                    "exp_alerts": [
                        {
                            "exp_labels": {"alertname": "KVCalibrationReconcileErrors", "severity": "warning"},
                            "exp_annotations": annotations(
                                rules, "KVCalibrationReconcileErrors", "kvcal reconcile errors: 100m/s"
                            ),
                        }
                    ],
                },
            ],
        }
    ]
    proc = run_promtool_tests(tmp_path, rules, tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    rules = []
    for i, (title, expr) in enumerate(dashboard_exprs()):
        for var, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, f"{title}: unsubstituted variable in {expr}"
        rules.append({"record": f"kvcal:dashboard:{i}", "expr": expr})
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(json.dumps(rules))  # every query made it into the file
