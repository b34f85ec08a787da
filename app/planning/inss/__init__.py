"""InSS: several models sharing a device (inss.txt).

* `latency.py`, `lwr.py`, `fit.py` — the latency model (§4): a batch's
  execution time on a device shared with co-located models (upload, kernel
  scheduling with interference, running time by locally weighted regression
  scaled by L2 cache contention, download) and a task's latency through the
  FIFO batch queue (eq. 2), with the least-squares fits of its coefficients;
* `gpulet_data.py` — Gpulet's measured utilisation data (data/gpulet/);
* BDA, the batch decision algorithm (§5.3, Algorithm 1), is
  app/scheduling/bda.py: the `inss` policy runs it too, on measured rates;
* `problem.py` — the placement problem (§3.3, problem (1)) and what a device
  configuration serves (BDA under memory, the SLO's worst case and the rate);
* `placement.py` — the placement: an exact branch and bound over devices and
  share grids for small clusters, a greedy heuristic for larger ones;
* `plan.py`, `config.py`, `cli.py` — the plan and its file, the YAML input,
  `python -m app plan inss`."""
