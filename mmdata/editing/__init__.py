"""`mmdata edit`: new versions of a store that keep or delete some of its episodes, written beside the versions
before them and pointing at the same shards and arrays (no media copied or re-encoded)."""
