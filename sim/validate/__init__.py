"""End-to-end validation against real serving runs (`kernelsight validate`).

rows.py         the validation CSV, checked, and each row's model config and layout
run.py          simulating a row as the benchmark's closed loop; its re-priceable step log
composition.py  host terms of the engine profile as an exact affine function of the step log; fit, LOMO
allreduce.py    the custom all-reduce latency model of the engine profile, fitted on kernel data
report.py       errors, summaries, parity plots, Markdown report, README accuracy block
commands.py     the command
"""
