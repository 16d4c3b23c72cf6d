"""The real batched serving loop: continuous batching of real speculative decoding on the torch models.

* :mod:`calibration.serving.specdec` - one speculative step over a fixed batch (draft -> policy -> verify ->
  rejection sampling -> bonus);
* :mod:`calibration.serving.batch` - a live batch that requests join (after prefill) and leave;
* :mod:`calibration.serving.chunked` - co-located chunked prefill: the waiting queue, the prefill set, each step's
  chunks and their log;
* :mod:`calibration.serving.clock` - the decode clock (wall, or the loop thread's CPU seconds plus its sleeps);
* :mod:`calibration.serving.speed_meter` - the machine's speed read beside the work (a canary before each step),
  for the validation's drift measure;
* :mod:`calibration.serving.loop` - ``serve``: traffic, admission, finishing and the run's tables, on a wall clock.

Design choice: this loop is the ground truth the simulator is validated against
(``calibration.validation``, ``docs/validation.md``), so it is deliberately an
independent implementation of admission (FCFS under the concurrency and KV limits),
finishing, the step records and the verified/accepted length histograms. It follows
the simulator's rules, not its code: were the two to share the engine logic, a bug in
it would show up on both sides and the validation could not see it. What it shares
with the simulator is pure pieces only: from ``policies``, the policy objects, their
memory across steps (``PolicyMemory``), the decision checks and the token-level
sampler; from ``simulator``, the record schemas and limits (``RequestStore``,
``StepLog``, ``EngineLimits``) and the metric definitions (``summarize``), so that both
sides fill and summarise the same tables. It never calls the simulator's engine logic
(``DecodeEngine``, the cluster, the SimPy processes).

Imports :mod:`calibration.models` only (within ``calibration``).
"""
