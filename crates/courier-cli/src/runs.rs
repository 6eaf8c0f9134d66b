//! Wired when courier-runs lands.
