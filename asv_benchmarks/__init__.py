"""asv suite: one module per op family (``time_*`` end in a synchronize; ``track_*`` report
GB/s, TFLOP/s or the ratio to the baseline measured in the same process). On a GPU machine
without network, ``asv run --environment existing`` uses the installed packages."""
