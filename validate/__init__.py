"""End-to-end validation: scoring the simulator against real serving runs (`kernelsight validate`).

rows.py          the validation CSV, checked, and each row's model config and layout
run.py           simulating a row as the benchmark's closed loop; its re-priceable step log
composition.py   host terms of the engine profile as an exact affine function of the step log; fit, LOMO
allreduce.py     the custom all-reduce latency model of the engine profile, fitted on kernel data
cross_bundle.py  the cross-device tier's η bundle (fitted without some GPUs), cached, rebuilt when stale
score.py         every row per tier: simulated, scored, host terms held out
context.py       the report's protocol, composition and error-structure sections
report.py        errors, summaries, parity plots, Markdown report, README accuracy block
serve.py         the same against our own `kernelsight bench serve` runs
"""
