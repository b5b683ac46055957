"""Calibration far below the served context: the summary's warning reaches status, condition and an event."""

import json

from kvcal.calibrator.coverage import length_coverage
from kvcal.core.decide import decide
from tests.unit.test_decide import CALIB, SPEC, SUMMARY, P, status
from tests.unit.test_decide_support import NOW, job, observations


def test_context_warning_reaches_status_condition_and_a_warning_event() -> None:
    warning = length_coverage([512], 8192, "max_position_embeddings", 512, truncated=3).warning
    assert warning
    summary = json.dumps(
        {**json.loads(SUMMARY), "longestSampleTokens": 512, "servedContextTokens": 8192, "contextWarning": warning}
    )
    d = decide(SPEC, status(P.CALIBRATING), observations(calibration_job=job(CALIB, "Succeeded", summary)), NOW)
    c = d.status.calibration
    assert (c.longest_sample_tokens, c.served_context_tokens, c.context_warning) == (512, 8192, warning)
    assert d.status.phase == P.VERIFYING  # a warning, not a failure
    assert [(e.type, e.reason, e.message) for e in d.events if e.reason == "CalibrationContextShort"] == [
        ("Warning", "CalibrationContextShort", warning)
    ]
    calibrated = next(x for x in d.status.conditions if x.type == "Calibrated")
    assert calibrated.status == "True" and warning in calibrated.message


def test_no_warning_no_event() -> None:
    d = decide(SPEC, status(P.CALIBRATING), observations(calibration_job=job(CALIB, "Succeeded", SUMMARY)), NOW)
    assert d.status.calibration.context_warning is None
    assert not [e for e in d.events if e.reason == "CalibrationContextShort"]
