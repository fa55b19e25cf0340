"""`compress search`: the fastest artifact within the red line (or the most accurate within the p99
budget), found by building and measuring real artifacts of pipeline variants."""
