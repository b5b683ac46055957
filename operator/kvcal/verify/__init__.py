"""Checks that a calibrated checkpoint carries K/V scales vLLM will load (static), and that vLLM really loaded them
(runtime read-back from a real vLLM engine)."""
