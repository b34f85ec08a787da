"""InSS: several models sharing a device (inss.txt): the latency model,
batch decisions (BDA) and placement."""
