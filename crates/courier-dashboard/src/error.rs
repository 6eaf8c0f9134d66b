//! The dashboard's errors, and how a page or the API answers with one.

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use courier_core::TransportError;
use courier_core::failed::RetryFailedError;
use courier_runs::{RunError, StoreError};

/// What went wrong serving a request. Messages name ids and transports, never message bodies.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DashboardError {
    /// The run store failed.
    #[error("the run store failed")]
    Store(#[from] StoreError),
    /// A transport failed.
    #[error("a transport failed")]
    Transport(#[from] TransportError),
    /// Retrying a failed message was refused.
    #[error(transparent)]
    Retry(#[from] RetryFailedError),
    /// Nothing by that id or name.
    #[error("{0}")]
    NotFound(String),
    /// A parameter that does not parse, or an action that cannot be done.
    #[error("{0}")]
    BadRequest(String),
    /// A missing or wrong CSRF token.
    #[error("{0}")]
    Forbidden(String),
    /// An action on a run was refused (not found, not in the status it needs, another signal
    /// awaited) or failed (store, dispatch).
    #[error(transparent)]
    Run(#[from] RunError),
    /// The listener failed.
    #[error("the listener failed")]
    Io(#[source] std::io::Error),
}

impl DashboardError {
    fn status(&self) -> StatusCode {
        match self {
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::Retry(RetryFailedError::Transport(_)) => StatusCode::BAD_GATEWAY,
            Self::Retry(_) => StatusCode::CONFLICT,
            Self::Store(_) | Self::Transport(_) => StatusCode::BAD_GATEWAY,
            Self::Run(RunError::NotFound(_)) => StatusCode::NOT_FOUND,
            Self::Run(RunError::UnknownSignal { .. } | RunError::WrongStatus { .. }) => {
                StatusCode::CONFLICT
            }
            Self::Run(RunError::UnknownAgent(_)) => StatusCode::BAD_REQUEST,
            Self::Run(_) => StatusCode::BAD_GATEWAY,
            Self::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The message with its causes.
    fn text(&self) -> String {
        courier_core::error_chain(self).to_string()
    }
}

/// An error answered as an HTML page.
#[derive(Debug)]
pub(crate) struct PageError(pub(crate) DashboardError);

/// An error answered as `{"error": "..."}`.
#[derive(Debug)]
pub(crate) struct ApiError(pub(crate) DashboardError);

macro_rules! from_errors {
    ($($target:ident),*) => {$(
        impl From<DashboardError> for $target {
            fn from(e: DashboardError) -> Self {
                Self(e)
            }
        }
        impl From<StoreError> for $target {
            fn from(e: StoreError) -> Self {
                Self(e.into())
            }
        }
        impl From<TransportError> for $target {
            fn from(e: TransportError) -> Self {
                Self(e.into())
            }
        }
        impl From<RetryFailedError> for $target {
            fn from(e: RetryFailedError) -> Self {
                Self(e.into())
            }
        }
        impl From<RunError> for $target {
            fn from(e: RunError) -> Self {
                Self(e.into())
            }
        }
    )*};
}

from_errors!(PageError, ApiError);

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let status = self.0.status();
        let title = status.canonical_reason().unwrap_or("Error");
        let body = crate::pages::layout::page(
            title,
            crate::pages::layout::Nav::None,
            maud::html! {
                div.notice.error { (self.0.text()) }
                p { a href="/" { "Back to the overview" } }
            },
        );
        (status, Html(body.into_string())).into_response()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.0.status();
        (
            status,
            axum::Json(serde_json::json!({ "error": self.0.text() })),
        )
            .into_response()
    }
}
