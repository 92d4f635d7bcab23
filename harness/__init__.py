"""cutbench harness: scenarios, plans, checkpoint pipeline, oracle, results, CLI."""

__version__ = "0.1.0"
