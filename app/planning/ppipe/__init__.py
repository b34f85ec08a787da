"""PPipe's control plane (ppipe.txt §5.2–5.3, App. A.2): models as chains of
blocks profiled per device class, batch size and share, and the plans that
cut them into pipelines over pools of devices."""
