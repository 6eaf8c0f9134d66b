//! Courier facade.
pub use courier_core::*;
