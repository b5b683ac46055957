import pytest
from pydantic import ValidationError

from kvcal.calibrator.config import DEFAULT_MAX_SAMPLES, CalibrationConfig

BASE = {"modelDir": "/m", "data": "/d.jsonl", "out": "/o"}


def test_camel_case_job_config_with_defaults() -> None:
    c = CalibrationConfig.model_validate({**BASE, "maxSeqLength": 2048, "strategy": "head"})
    assert c.max_seq_length == 2048 and c.samples is None and c.holdout_fraction == 0.1
    assert c.max_model_len is None
    assert c.compressor_strategy == "attn_head" and c.compressor_observer == "static_minmax"


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"observer": "percentile"}, "observer"),
        ({"holdoutFraction": 0.9}, "holdoutFraction"),
        ({"samples": 0}, "samples"),
        ({"lengthBuckets": [512, 256]}, "lengthBuckets"),
        ({"lengthDistribution": {300: 1.0}}, "lengthDistribution"),
        ({"unknownKnob": 1}, "unknownKnob"),
    ],
)
def test_bad_values_name_the_field(extra: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as e:
        CalibrationConfig.model_validate({**BASE, **extra})
    assert field in str(e.value)


def test_default_sample_count_takes_what_is_there_up_to_512() -> None:
    default = CalibrationConfig.model_validate(BASE)
    assert (default.sample_count(34), default.sample_count(5000)) == (34, DEFAULT_MAX_SAMPLES) == (34, 512)
    assert CalibrationConfig.model_validate({**BASE, "samples": 100}).sample_count(34) == 100  # explicit: checked


@pytest.mark.parametrize(
    ("extra", "calibration_samples", "available", "held_out"),
    [
        ({}, 9, 100, 1),  # 9 x 0.1 / 0.9 is 1.0000000000000002 in floating point: still 1
        ({}, 10, 100, 2),
        ({}, 512, 5000, 57),  # the CRD's defaults: a tenth of the 569 prompts used, not a tenth of the dataset
        ({"holdoutFraction": 0.5}, 40, 600, 40),
        ({"holdoutFraction": 0.25}, 6, 1, 1),  # never more than the split held out
        ({"holdoutSamples": 20}, 512, 5000, 20),
        ({"holdoutSamples": 20}, 512, 7, 7),
    ],
)
def test_holdout_count_is_holdout_fraction_of_the_samples_used(
    extra: dict[str, object], calibration_samples: int, available: int, held_out: int
) -> None:
    config = CalibrationConfig.model_validate({**BASE, **extra})
    assert config.holdout_count(calibration_samples, available) == held_out
