//! The HTML pages, one file each, and what they share.

pub(crate) mod failed;
pub(crate) mod keys;
pub(crate) mod layout;
pub(crate) mod overview;
pub(crate) mod pause;
pub(crate) mod run;
pub(crate) mod run_actions;
pub(crate) mod runs;
pub(crate) mod workers;

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use courier_runs::Run;
use maud::{Markup, html};
use uuid::Uuid;

use crate::error::DashboardError;
use crate::state::Shared;

/// Parses a run id from the path.
pub(crate) fn parse_id(id: &str) -> Result<Uuid, DashboardError> {
    Uuid::parse_str(id)
        .map_err(|_| DashboardError::BadRequest(format!("`{id}` is not a run id (a UUID)")))
}

/// The run, or a 404.
pub(crate) async fn find(shared: &Shared, id: Uuid) -> Result<Run, DashboardError> {
    shared
        .store
        .find(id)
        .await?
        .ok_or_else(|| DashboardError::NotFound(format!("run {id} not found")))
}

/// A rendered page.
pub(crate) fn html(markup: Markup) -> Html<String> {
    Html(markup.into_string())
}

/// The hidden field every state-changing form carries.
pub(crate) fn csrf_field(shared: &Shared) -> Markup {
    html! { input type="hidden" name="csrf" value=(shared.csrf); }
}

/// Percent-encodes a query value (RFC 3986 unreserved characters pass).
pub(crate) fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An absent or blank query value is no value.
pub(crate) fn given(value: Option<&str>) -> Option<&str> {
    value.map(str::trim).filter(|v| !v.is_empty())
}

/// Any other path.
pub(crate) async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        html(layout::page(
            "Not found",
            layout::Nav::None,
            html! {
                div.notice.error { "There is no such page." }
                p { a href="/" { "Back to the overview" } }
            },
        )),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(super::encode("a b&c=<d>"), "a%20b%26c%3D%3Cd%3E");
        assert_eq!(super::encode("1700_ab-cd"), "1700_ab-cd");
    }
}
