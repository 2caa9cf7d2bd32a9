"""The source article's quantitative claims, answered on asynccomm's cluster model.

One module per claim, each runnable as ``python -m results.<name>``: it prints a table,
and writes its numbers as JSON and its picture as PNG under ``docs/``.
``python -m results`` (``make results``) runs them all.

- ``bandwidth``: default (store-and-forward) against optimised (pipelined) bandwidth,
  1 MB to 1 GB over 100G RoCE, with the line rate.
- ``async_vs_sync``: a training step with blocking send/recv after compute against
  isend/irecv overlapped with compute, over compute-to-communication ratios.
- ``parameter_server``: ResNet-50 and a DLRM recommender on a parameter server: no
  overlap, per-layer overlap, 1-bit compression, sharded servers.
- ``scaling``: weak scaling from 8 to 1024 ranks: one server, sharded servers, a ring
  all-reduce.
- ``chunking``: the article's 1/4/16 MB chunk rule against the model's c* and a sweep.

Everything runs on the virtual clock, so every number is model time and every run gives
the same numbers.
"""
