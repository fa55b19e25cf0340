"""How fast a deployed file is, measured through worker processes: the closed-loop harness, latency under
traffic (scenarios, sweeps, capacity), what else ran on the machine, and per-operator profiles."""
