"""Planning an epoch before anything is read: what to sample (specs, episodes, mixtures), the
samples and their order, packing into token-budgeted micro-batches, and each rank's share.
"""
