"""The rollout machine: Deploying -> Analyzing -> AwaitingPromotion -> Promoting / RollingBack -> Succeeded, and the
watch after a promotion (core.rollout.watch). It starts only from a verified checkpoint (core.artifact.record) and
calls the artifact machine once: for a re-verification when the promoted baseline's vLLM runtime changes.
"""
