"""InSS: several models sharing a device (inss.txt).

* `latency.py`, `lwr.py`, `fit.py` — the latency model (§4): a batch's
  execution time on a device shared with co-located models (upload, kernel
  scheduling with interference, running time by locally weighted regression
  scaled by L2 cache contention, download) and a task's latency through the
  FIFO batch queue (eq. 2), with the least-squares fits of its coefficients;
* `gpulet_data.py` — Gpulet's measured utilisation data (data/gpulet/);
* `bda.py` — the batch decision algorithm (§5.3, Algorithm 1)."""
