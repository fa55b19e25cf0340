"""Statistics with no knowledge of models or runtimes: percentiles and their intervals, block-paired latency
ratios, paired accuracy tests. The ground floor every figure in a report rests on."""
