"""Encoding and decoding of video segments, audio and low-dimensional arrays."""
