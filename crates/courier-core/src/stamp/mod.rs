//! Stamps: typed metadata attached to an [`Envelope`](crate::Envelope).
//!
//! A stamp is a small serde type with a stable [`Stamp::NAME`]. Sendable stamps travel with the
//! message (one `x-courier-stamp-<name>` header per kind, holding a JSON list); local stamps
//! ([`Stamp::SENDABLE`] `= false`) describe this process only (which transport received it, what
//! id it has there) and are dropped when the envelope is encoded.

mod builtin;
mod key_load;
mod key_path;

use std::any::Any;
use std::fmt::Debug;

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use builtin::*;
pub use key_load::{KeyLoad, KeyLoads};
pub use key_path::KeyPath;

/// Typed metadata on an envelope.
///
/// ```
/// use courier_core::Stamp;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, Clone, Serialize, Deserialize)]
/// struct TenantStamp(String);
///
/// impl Stamp for TenantStamp {
///     const NAME: &'static str = "tenant";
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a Courier stamp",
    note = "implement `courier::Stamp` for `{Self}` with a stable `NAME`"
)]
pub trait Stamp: Serialize + DeserializeOwned + Debug + Clone + Send + Sync + 'static {
    /// The stable name; the wire header is `x-courier-stamp-<NAME>`.
    const NAME: &'static str;
    /// Whether the stamp goes on the wire (`true`) or stays in this process.
    const SENDABLE: bool = true;
}

/// A type-erased stamp.
pub(crate) trait AnyStamp: Any + Debug + Send + Sync {
    fn name(&self) -> &'static str;
    fn sendable(&self) -> bool;
    /// Appends the stamp as JSON to `out`.
    fn write_json(&self, out: &mut String) -> Result<(), serde_json::Error>;
    fn as_any(&self) -> &dyn Any;
}

impl<S: Stamp> AnyStamp for S {
    fn name(&self) -> &'static str {
        S::NAME
    }
    fn sendable(&self) -> bool {
        S::SENDABLE
    }
    fn write_json(&self, out: &mut String) -> Result<(), serde_json::Error> {
        out.push_str(&serde_json::to_string(self)?);
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
