"""Implementations of the Protocols in kvcal.ports (Kubernetes, Prometheus, HTTP probes, traffic routers)."""
