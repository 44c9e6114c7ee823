"""Command-line tools: `mmdata synth | convert | inspect | verify | demo`."""
