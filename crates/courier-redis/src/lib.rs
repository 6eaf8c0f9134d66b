//! Courier redis (work in progress).
