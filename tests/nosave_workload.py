"""A counter that cannot save its own state (for the ``app`` backend's refusal test)."""

from workloads.counter import Counter


class CounterWithoutSave(Counter):
    """``counter`` without application-level checkpoints."""

    name = "counter_without_save"
    save_state = None
