"""The live daemon: the dispatcher that drives the scheduling core, and the
service the HTTP layer calls."""
