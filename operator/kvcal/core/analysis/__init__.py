"""The analysis wing: is the canary as good as the baseline? Pure, like the rest of core.

``verdict`` turns readings into Measurements and counts intervals into a run's verdict; ``ranktest`` (with
``histograms``, ``podspread`` and ``sequential``) is the latency test; ``saturation``, ``quality``, ``capacity`` and
``share`` are the other checks; ``promql`` renders the queries the Prometheus adapter runs. Nothing here imports the
rollout machine: it reads measurements and spec, and the machine reads its verdicts.
"""
