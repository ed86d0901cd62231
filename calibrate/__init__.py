"""Measure a real device and fit a calibration profile (torch, pynvml).

The estimator never imports this package: torch and pynvml are an optional
extra, installed with ``pip install 'llm-roofline[calibrate]'``.
"""

from __future__ import annotations

INSTALL_HINT = "pip install 'llm-roofline[calibrate]'"  # torch==2.13.0 (CPU build on CI) and nvidia-ml-py


def require_torch():
    """Import torch, or fail with a user error that names the exact command installing the calibration extra."""
    from estimator.errors import ConfigurationError

    try:
        import torch
    except ImportError:
        raise ConfigurationError(f"measuring needs torch and pynvml; install them with: {INSTALL_HINT}") from None
    return torch
