"""Hardware profiles fitted from the benchmark results serving teams already have.

``python -m calibration.fit_profile RESULTS... --out profile.json`` reads
``vllm bench serve --save-result`` JSON, SGLang ``bench_serving`` JSONL or a plain
CSV (:mod:`calibration.fitting.readers`), turns every run into one observation of
the mean step time (:mod:`calibration.fitting.runs`), fits a linear step-cost
model by regularised least squares (:mod:`calibration.fitting.model`,
:mod:`calibration.fitting.fit`), says which of its parameters the data pins down
and which it cannot (:mod:`calibration.fitting.identify`), and writes a profile
that carries the unidentified range as alternative parameter sets
(:mod:`calibration.fitting.export`). numpy, scipy and pandas only: no torch here.
"""
