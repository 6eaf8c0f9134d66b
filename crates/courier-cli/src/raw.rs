//! The raw drivers doing the same protocol work as the transports, for `courier bench --raw`.

use courier_core::Dsn;

use crate::commands::bench::{Figures, Work};
use crate::error::CliResult;

/// Measures the raw driver for `dsn`, or `None` when there is no raw implementation.
pub(crate) async fn measure(dsn: &Dsn, work: &Work) -> CliResult<Option<Figures>> {
    let _ = (dsn, work);
    Ok(None)
}
