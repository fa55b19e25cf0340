"""``compress doctor``: the first command on a new machine.

A figure this project reports depends on the machine as much as on the model: the instruction set
decides the training precision and the INT8 kernels, the runtimes installed decide what the bench
measures, and a runtime that imports but cannot run a file only shows itself deep inside a
pipeline. The doctor says all of it up front, in one place: what the CPU (and GPU) is, which
runtimes are installed and what they see, what the defaults will choose here and why, and a
seconds-long smoke run of every runtime on a tiny model. ``--gpu`` is the longer check a GPU
machine runs (the GPU tests, an INT8 TensorRT engine and a cuda bench of the quickstart).

Modules: ``machine`` (CPU facts), ``runtimes`` (one row per runtime), ``defaults`` (the defaults'
choices), ``smoke`` (the smoke run), ``gpu_check`` (``--gpu``), ``view`` (the tables) and
``checkup`` (runs them in order, writes the JSON, decides the exit code).
"""
