#!/usr/bin/env bash
# The calibrator's GPU acceptance check (benchmarks/gpu_check.py says what it proves). Three commands:
#   bash hack/gpu-check.sh prepare   # here (PyPI): the wheels a GPU machine without PyPI lacks into .whl/, and the
#                                    # tokenizer into .gpu-check/ (both git-ignored; together well under 64 MiB)
#   bash hack/gpu-check.sh run       # on the GPU machine, from the repository root: under 5 minutes on one H200
#   bash hack/gpu-check.sh dry-run   # here, on the CPU: the same script with a 2-layer model and no CUDA asserts
# With the device tool: run `prepare` here, then run `bash hack/gpu-check.sh run` there with carry [".whl",
# ".gpu-check"]; the table is printed and $OUT/gpu-check.json comes back.
# The GPU machine needs python3 with torch (CUDA), transformers, accelerate, safetensors, numpy, matplotlib, pyyaml,
# tqdm and tokenizers; everything else kvcal's calibrator imports travels in .whl/ (llm-compressor and datasets do
# not: the default path, one forward pass with static min-max, needs neither).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
WHEELS=(
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
  compressed-tensors==0.19.0 loguru==0.7.3 psutil==7.2.2
)

case "${1:-}" in
prepare)
  rm -rf .whl .gpu-check && mkdir -p .whl .gpu-check/tokenizer
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
  "$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl .
  model=$("$PY" -c 'from kvcal.demo import demo_model_dir; print(demo_model_dir())' 2>/dev/null | tail -1)
  for name in tokenizer.json tokenizer_config.json special_tokens_map.json chat_template.jinja; do
    if [ -f "$model/$name" ]; then cp "$model/$name" .gpu-check/tokenizer/; fi
  done
  du -sh .whl .gpu-check
  ;;
run)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kvcal-site .whl/*.whl
  export PYTHONPATH=/tmp/kvcal-site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  python3 benchmarks/gpu_check.py --work /tmp/kvcal-gpu-check --tokenizer .gpu-check/tokenizer \
    --out "${OUT:-out/gpu-check}"
  ;;
dry-run)
  HF_HUB_OFFLINE=1 "$PY" benchmarks/gpu_check.py --dry-run --work "${TMPDIR:-/tmp}/kvcal-gpu-check" \
    --out out/gpu-check
  ;;
*)
  echo "usage: bash hack/gpu-check.sh prepare|run|dry-run" >&2
  exit 2
  ;;
esac
