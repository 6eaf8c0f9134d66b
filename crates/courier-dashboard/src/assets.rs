//! The stylesheet, the script and the icon, compiled in.

use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::IntoResponse;

const CSS: &str = include_str!("../assets/dashboard.css");
const JS: &str = include_str!("../assets/dashboard.js");
const ICON: &str = include_str!("../assets/favicon.svg");

pub(crate) async fn css() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/css; charset=utf-8"),
            (CACHE_CONTROL, "max-age=300"),
        ],
        CSS,
    )
}

pub(crate) async fn js() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (CACHE_CONTROL, "max-age=300"),
        ],
        JS,
    )
}

pub(crate) async fn favicon() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "image/svg+xml"),
            (CACHE_CONTROL, "max-age=86400"),
        ],
        ICON,
    )
}
