//! Fingerprints (content hashes) for dedup. STUB: to be implemented.
