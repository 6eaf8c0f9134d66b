//! Courier runs (work in progress).
