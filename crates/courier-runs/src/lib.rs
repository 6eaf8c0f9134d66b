//! Durable runs (wip).

mod classify;
mod status;
mod store;

pub use classify::{FailureClass, ProviderError, classify};
pub use status::{Outcome, RunStatus, TerminationReason, UnknownName};
pub use store::{
    Dialect, MemoryRunStore, NewRun, Run, RunEvent, RunStore, Settlement, SqlRunStore,
    SqlRunStoreOptions, StoreError,
};
