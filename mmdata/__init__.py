"""mmdata: multimodal episode stores and a loader that keeps training GPUs fed."""

__version__ = "0.1.0"
