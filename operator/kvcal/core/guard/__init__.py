"""The guard wing: what a KVCalibration may make the operator do on its author's behalf.

``policy`` holds the cluster admin's chart policy and checks a spec against it before any child exists;
``vllm_allowlist`` types each vLLM flag an extraArgs entry may pass; ``inuse`` refuses an output that would overwrite
what the baseline serves; ``redact`` keeps credentials out of every status, event and log line.
"""
