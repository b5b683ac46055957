"""The next status, built in one pass: ``builder.Builder`` (phase, conditions, history, actions), the
metav1.Condition rules (``conditions``) and the Events a history entry becomes (``events``).

The builder knows the phase rules only through ``builder.PhaseRules``, a small Protocol the phase table satisfies, so
this package imports nothing of the machines or the table.
"""
