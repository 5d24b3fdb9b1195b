"""`greta bench`: GRETA ops timed side by side with the vendor path and torch.compile.

One run measures the machine's ceilings (device-to-device copy bandwidth, bf16 matmul
TFLOP/s), times every case of a preset with each implementation, and writes CSV, JSON
(with metadata) and a PNG chart. Cases whose op is not registered in this build are
recorded as skipped with the reason, never dropped.

Modules: ``cases`` (what is timed), ``timing`` (how), ``metadata`` (where and with what),
``report`` (derived numbers and files), ``runner`` (the imperative shell).
"""
