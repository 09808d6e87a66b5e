"""Searches over a graph's nodes driven by a comparator: the smallest subgraph that still fails (reduce) and the fewest
nodes to give back to higher precision so a variant passes (repair)."""

CHECKS = ("fp16", "int8", "parse", "build", "command")  # what `trtflow reduce --check` can reduce for
