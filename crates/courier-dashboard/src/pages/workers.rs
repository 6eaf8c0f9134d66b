//! `/workers`: the live workers of the worker registry, when the configuration has one, and the
//! LLM agents' circuit breakers when the options give them.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Html;
use maud::html;

use super::layout::{self, Nav};
use crate::error::PageError;
use crate::state::Shared;

/// What the page says when no transport keeps a worker registry.
pub(crate) const NO_REGISTRY: &str = "no worker registry in this configuration";

pub(crate) async fn page(State(shared): State<Arc<Shared>>) -> Result<Html<String>, PageError> {
    let workers = match shared.registry() {
        Some(r) => Some(r.list().await?),
        None => None,
    };
    let breakers = match &shared.options.breakers {
        Some(source) => Some(source.breakers().await),
        None => None,
    };
    let now = layout::now_ms();
    let body = html! {
        h1 { "Workers" }
        @match &workers {
            None => div.notice.info #no-registry {
                "There is " (NO_REGISTRY) ": none of its transports keeps one (SQL and Redis \
                 transports do), so workers cannot be listed here."
            },
            Some(list) if list.is_empty() => div.panel { div.empty { "No worker is alive." } },
            Some(list) => div.panel {
                table #workers {
                    thead { tr {
                        th { "Worker" } th { "Host" } th.num { "Pid" } th { "Version" }
                        th { "Transports" } th { "Started" } th { "Last heartbeat" }
                        th.num { "Handled" } th.num { "Failed" } th { "" }
                    } }
                    tbody {
                        @for w in list {
                            tr {
                                td.mono { (w.id) }
                                td { (w.host) }
                                td.num { (w.pid) }
                                td { (w.version) }
                                td { (w.transports.join(", ")) }
                                td { (layout::time(w.started_at_ms)) }
                                td { (layout::relative(w.last_heartbeat_ms, now)) }
                                td.num { (w.handled) }
                                td.num { (w.failed) }
                                td { @if w.stop_requested { span.badge.s-waiting_for_input { "stopping" } } }
                            }
                        }
                    }
                }
            },
        }
        @if let Some(breakers) = &breakers {
            h2 { "Circuit breakers" }
            @match breakers {
                Err(e) => div.notice.error #breakers-error { "The breakers cannot be read: " (e) },
                Ok(list) if list.is_empty() => div.panel {
                    div.empty { "No provider has been called yet." }
                },
                Ok(list) => div.panel {
                    table #breakers {
                        thead { tr {
                            th { "Provider" } th { "State" } th.num { "Failures" } th { "Opened" }
                        } }
                        tbody {
                            @for b in list {
                                tr {
                                    td { (b.provider) }
                                    td { span.badge.{"breaker-" (b.state)} { (b.state) } }
                                    td.num { (b.failures) }
                                    td { @if b.opened_at_ms > 0 { (layout::time(b.opened_at_ms)) } @else { "never" } }
                                }
                            }
                        }
                    }
                },
            }
        }
    };
    Ok(super::html(layout::page("Workers", Nav::Workers, body)))
}
