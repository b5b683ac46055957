"""The artifact machine: Pending -> Calibrating -> Verifying -> a verified checkpoint (core.artifact.record).

It owns the calibration Job, the verification Job (before the canary, and again after a promotion when the baseline's
vLLM runtime changes: core.rollout.watch asks for it through core.artifact.verification) and the record the rollout
machine starts from. It never reads the canary or the route.
"""
