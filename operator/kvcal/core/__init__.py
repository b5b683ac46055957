"""The operator's pure core: no I/O, no clock. Everything here takes its inputs as arguments (including `now`)."""
