"""Conversion of recorded episodes into stores: encode each episode, then write it to a store."""
