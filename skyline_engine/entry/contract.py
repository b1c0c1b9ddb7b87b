"""Skyline's entry-point contract: the names every tool that reads an entry point agrees on.

The editor half (lua/skyline/constants.lua) keeps the same names; tests/test_parity.py fails when
the two drift apart.
"""

from __future__ import annotations

MODEL_PROVIDER = "skyline_model_provider"
INPUT_PROVIDER = "skyline_input_provider"
ITERATION_PROVIDER = "skyline_iteration_provider"
PROVIDERS = (MODEL_PROVIDER, INPUT_PROVIDER, ITERATION_PROVIDER)

# The input provider's parameter whose default is the batch size (and which editors rewrite).
BATCH_SIZE_PARAMETER = "batch_size"
