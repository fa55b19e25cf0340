"""The report: its typed model, its tables, plots and sections, and the files it is written to. It reads
results; it measures nothing."""
