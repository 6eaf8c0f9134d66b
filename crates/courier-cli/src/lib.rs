//! Courier cli (work in progress).
