"""Runners behind one interface, the latency harness, accuracy of deployed artifacts, the report and gate.

May import ``train`` for data only; never ``compress``.
"""
