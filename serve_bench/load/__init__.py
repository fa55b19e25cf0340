"""Latency under traffic: the serving loop in each artifact's worker, MLPerf LoadGen scenarios driving it,
the search for the highest load within a p99 budget, and an independent open-loop check."""
