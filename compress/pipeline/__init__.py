"""The pipeline floor: the pipeline file and its validation, input wiring, the runner, the
manifest, the run lock, the environment fingerprint, and the views of a run directory the CLI
prints.
"""
