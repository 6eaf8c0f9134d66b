//! The overview's concurrency keys: for each queue with flow control per key, its busiest keys'
//! messages in flight (of the most allowed) and queued, the rest summed as `other` (the same
//! bounded set `courier stats --keys` prints and the per-key gauges export).

use courier_core::metrics::KEY_GAUGE_TOP;
use courier_core::{KeyLoads, TransportError};
use maud::{Markup, html};

use crate::state::Shared;

/// Each keyed queue's loads, or the error reading them; empty when no queue is keyed.
pub(crate) async fn loads(shared: &Shared) -> Vec<(String, Result<KeyLoads, TransportError>)> {
    let mut out = Vec::new();
    for (name, transport) in shared.transports.all() {
        if let Some(keyed) = transport.as_keyed_queue() {
            out.push((name.clone(), keyed.key_loads(KEY_GAUGE_TOP).await));
        }
    }
    out
}

/// The section: nothing when no queue is keyed.
pub(crate) fn section(loads: &[(String, Result<KeyLoads, TransportError>)]) -> Markup {
    let in_flight = |n: u64, max: Option<u32>| match max {
        Some(max) => format!("{n} / {max}"),
        None => n.to_string(),
    };
    html! {
        @if !loads.is_empty() {
            h2 { "Concurrency keys" }
            div.panel {
                table #keys {
                    thead { tr {
                        th { "Transport" } th { "Key" }
                        th.num title="delivered and not yet settled, of the most allowed at once" { "In flight" }
                        th.num title="ready to deliver (delayed messages not counted)" { "Queued" }
                    } }
                    tbody {
                        @for (name, loads) in loads {
                            @match loads {
                                Err(e) => tr { td { strong { (name) } } td colspan="3" { span.up title=(e.to_string()) { "error" } } },
                                Ok(l) if l.keys.is_empty() => tr {
                                    td { strong { (name) } } td.muted colspan="3" { "no key has messages" }
                                },
                                Ok(l) => {
                                    @for k in &l.keys {
                                        tr data-key=(k.key) {
                                            td { strong { (name) } } td.mono { (k.key) }
                                            td.num { (in_flight(k.in_flight, l.max)) } td.num { (k.queued) }
                                        }
                                    }
                                    @if let Some(o) = &l.other {
                                        tr.muted data-key="other" {
                                            td { strong { (name) } } td { "other (" (l.other_keys) " keys)" }
                                            td.num { (o.in_flight) } td.num { (o.queued) }
                                        }
                                    }
                                },
                            }
                        }
                    }
                }
            }
        }
    }
}
