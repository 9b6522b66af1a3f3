"""gmi-drl: fast deep reinforcement learning on one machine or many."""

__version__ = "0.1.0"
