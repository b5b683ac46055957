"""GPU acceptance check for the calibrator (hack/gpu-check.sh runs it on a lent GPU; `--dry-run` here on a CPU).

    python benchmarks/gpu_check.py --work DIR [--out DIR] [--dry-run] [--tokenizer DIR]

1. Builds a random-weight model with a real architecture (Llama 3.2 3B's shapes: 3.2B parameters, bf16, created on
   the GPU) and saves it; the tokenizer is SmolLM2's (its ids are all inside the model's vocabulary).
2. Runs `kvcal calibrate` in this process (calibrator/run.calibrate, the Job's code path) per tensor and per head on
   the bundled prompts (a few thousand tokens), with the device planned as in the Job (`--device auto`).
3. Asserts the work ran on CUDA: kvcal's own device report names cuda:0, and its peak CUDA memory is at least the
   weights.
4. Times kvcal's whole run less model load and save (preflight, calibration pass, held-out report, plots) against a
   plain forward of the same model over the same calibration tokens on the same GPU (goal <= 1.5x), with load and
   save printed beside it.
5. Calibrates a small random model on the CPU and on the GPU and compares the scales per layer and KV head (goal:
   within 2 bf16 ulps).
Prints one table and writes gpu-check.json to --out. Exit 1 when an assertion fails.
"""

import argparse
import json
import math
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from kvcal.calibrator.config import CalibrationConfig
from kvcal.calibrator.report import Report
from kvcal.calibrator.run import calibrate, preflight
from kvcal.demo import CALIBRATION_SET, HOLDOUT_SET

BIG = {  # Llama 3.2 3B
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 28,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128_256,
}
SMALL = {
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "vocab_size": 49_152,
}
DRY_RUN_BIG = {**SMALL, "num_hidden_layers": 2}  # the CPU here stands in for the GPU's 3B model
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
SLOWDOWN_GOAL = 1.5
ULP_GOAL = 2


def build_model(folder: Path, shape: dict[str, int], tokenizer: Path, device: str, seed: int) -> int:
    """A random-weight LlamaForCausalLM in bf16, created on `device`, saved with the tokenizer; returns its bytes."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if folder.exists():
        shutil.rmtree(folder)
    config = LlamaConfig(
        **shape,
        max_position_embeddings=8192,
        rope_theta=500_000.0,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
        architectures=["LlamaForCausalLM"],
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (tokenizer / name).is_file():
            shutil.copy2(tokenizer / name, folder / name)
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return size


def config_for(model: Path, out: Path, strategy: str, device: str, samples: int, length: int) -> CalibrationConfig:
    return CalibrationConfig(
        model_dir=model,
        data=CALIBRATION_SET,
        holdout_data=HOLDOUT_SET,
        out=out,
        strategy="head" if strategy == "head" else "tensor",
        samples=samples,
        max_seq_length=length,
        holdout_samples=max(1, samples // 8),
        device="cuda" if device.startswith("cuda") else "cpu",
        force=True,
    )


def plain_forward_seconds(config: CalibrationConfig, device: str) -> float:
    """The model's decoder over the same calibration tokens, nothing else (inputs built on the device)."""
    from transformers import AutoModelForCausalLM

    _info, _tokenizer, plan = preflight(config)
    model: Any = AutoModelForCausalLM.from_pretrained(config.model_dir, dtype=torch.bfloat16).to(device).eval()
    decoder = model.get_decoder()
    ids = [torch.tensor([sample.input_ids], device=device) for sample in plan.calibration]
    with torch.no_grad():
        decoder(input_ids=ids[0], use_cache=False)  # warm-up: kernels, allocator
        synchronize(device)
        started = time.perf_counter()
        for one in ids:
            decoder(input_ids=one, use_cache=False)
        synchronize(device)
    seconds = time.perf_counter() - started
    del model, decoder
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return seconds


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def without_load_and_save(report: Report) -> float:
    t = report.timings_seconds
    return sum(t.values()) - t.get("load model", 0.0) - t.get("save checkpoint", 0.0)


def bf16_ulp(value: float) -> float:
    return 2.0 ** (math.floor(math.log2(abs(value))) - 7) if value else 2.0**-133


def max_ulps(first: Report, second: Report) -> float:
    worst = 0.0
    for kind in ("k", "v"):
        for layer_a, layer_b in zip(first.scales[kind], second.scales[kind], strict=True):
            for a, b in zip(layer_a, layer_b, strict=True):
                worst = max(worst, abs(a - b) / bf16_ulp(max(abs(a), abs(b))))
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="scratch folder for models and checkpoints")
    parser.add_argument("--out", type=Path, help="where gpu-check.json goes")
    parser.add_argument("--tokenizer", type=Path, help="folder with tokenizer.json (default: the demo model's)")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--max-seq-length", type=int, default=512)
    parser.add_argument("--dry-run", action="store_true", help="no GPU: a 2-layer model on the CPU, no CUDA asserts")
    args = parser.parse_args()
    device = "cpu" if args.dry_run else "cuda:0"
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run on a CPU", file=sys.stderr)
        return 2
    tokenizer = args.tokenizer
    if tokenizer is None:
        from kvcal.demo import demo_model_dir

        tokenizer = demo_model_dir()
    args.work.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    rows: list[tuple[str, str, str]] = []
    results: dict[str, Any] = {
        "host": platform.node(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }

    started = time.perf_counter()
    big = args.work / "model-3b"
    weight_bytes = build_model(big, DRY_RUN_BIG if args.dry_run else BIG, tokenizer, device, seed=0)
    results["build_seconds"] = round(time.perf_counter() - started, 1)
    rows.append(("model", f"{weight_bytes / 1e9:.2f} GB bf16 ({weight_bytes // 2 / 1e9:.2f}B params)", ""))
    plain = plain_forward_seconds(
        config_for(big, args.work / "unused", "tensor", device, args.samples, args.max_seq_length), device
    )
    rows.append(("plain forward (calibration tokens)", f"{plain:.2f} s", ""))
    results["plain_forward_seconds"] = plain
    for strategy in ("tensor", "head"):
        config = config_for(big, args.work / f"out-{strategy}", strategy, device, args.samples, args.max_seq_length)
        report = calibrate(config)
        assert report.device is not None
        run = without_load_and_save(report)
        ratio = run / plain
        times = report.timings_seconds
        peak = report.device.peak_device_memory_bytes
        results[strategy] = {
            "device": report.device.model_dump(mode="json"),
            "timings_seconds": times,
            "tokens": report.summary.tokens,
            "ratio_to_plain": ratio,
        }
        rows.append(
            (f"calibrate {strategy}: device", f"{','.join(report.device.devices)} ({report.device.placement})", "")
        )
        rows.append(
            (f"calibrate {strategy}: peak device memory", f"{(peak or 0) / 1e9:.2f} GB", f">= {weight_bytes / 1e9:.2f}")
        )
        rows.append(
            (
                f"calibrate {strategy}: tokens, rate",
                f"{report.summary.tokens}, {report.device.calibration_tokens_per_second:,.0f} tok/s",
                "",
            )
        )
        rows.append(
            (f"calibrate {strategy}: run less load+save", f"{run:.2f} s = {ratio:.2f}x plain", f"<= {SLOWDOWN_GOAL}x")
        )
        rows.append(
            (
                f"calibrate {strategy}: load, save",
                f"{times.get('load model', 0):.1f} s, {times.get('save checkpoint', 0):.1f} s",
                "",
            )
        )
        rows.append((f"calibrate {strategy}: steps", ", ".join(f"{k} {v:.2f}" for k, v in times.items()), ""))
        if not args.dry_run:
            if report.device.devices != ["cuda:0"] or report.device.placement != "one-device":
                failures.append(f"{strategy}: ran on {report.device.devices} ({report.device.placement}), not cuda:0")
            if peak is None or peak < weight_bytes:
                failures.append(f"{strategy}: peak CUDA memory {peak} below the weights' {weight_bytes} bytes")
        if ratio > SLOWDOWN_GOAL and not args.dry_run:  # a goal for the GPU; the CPU's fixed costs differ
            failures.append(f"{strategy}: {ratio:.2f}x a plain forward (goal {SLOWDOWN_GOAL}x)")
    shutil.rmtree(big, ignore_errors=True)

    small = args.work / "model-small"
    build_model(small, SMALL, tokenizer, "cpu", seed=1)
    reports = {}
    for where in ("cpu", device):
        config = config_for(small, args.work / f"small-{where.replace(':', '')}", "head", where, 8, 256)
        reports[where] = calibrate(config.model_copy(update={"plots": False}))
    ulps = max_ulps(reports["cpu"], reports[device])
    results["small_model_max_ulps"] = ulps
    rows.append((f"scales cpu vs {device} (small model, per head)", f"max {ulps:.2f} bf16 ulps", f"<= {ULP_GOAL}"))
    if ulps > ULP_GOAL:
        failures.append(f"scales differ by {ulps:.2f} bf16 ulps between cpu and {device}")

    results["failures"] = failures
    results["seconds"] = round(time.perf_counter() - started, 1)
    width = max(len(name) for name, _, _ in rows)
    print(f"\nkvcal GPU check on {results['gpu'] or 'CPU (dry run)'}, torch {torch.__version__}")
    for name, value, goal in rows:
        print(f"{name:<{width}}  {value:<36} {goal}")
    print(f"total {results['seconds']} s; " + ("PASS" if not failures else "FAIL: " + "; ".join(failures)))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu-check.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
