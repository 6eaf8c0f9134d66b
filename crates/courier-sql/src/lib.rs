//! Courier sql (work in progress).
