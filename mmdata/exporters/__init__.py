"""Stores written out in other projects' formats: `mmdata export STORE DST --to lerobot`."""
