"""InSS's latency model (inss.txt §4): a batch's execution time on a GPU
shared under MPS with co-located models (upload, kernel scheduling with
interference, running time by locally weighted regression scaled by L2 cache
contention, download) and a task's latency through the FIFO batch queue
(eq. 2), with the least-squares fits of its coefficients and Gpulet's
measured utilisation data."""
