"""Skyline's analysis engine: measures a PyTorch training iteration and predicts batch-size effects.

The engine never imports pynvim: the editor talks to it through the service protocol.
"""

__version__ = "0.1.0"
