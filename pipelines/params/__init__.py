"""One module per stage kind: its parameter model (the YAML it accepts) and its row `KIND`."""
