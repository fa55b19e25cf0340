"""Structured pruning: network slimming (BN-L1 sparsity) and dependency-aware channel surgery with
torch-pruning. Takes plain modules and settings; never imports the pipeline or stage layers.
"""
