//! The guard every request passes: the allowed hosts, the token, and the security headers of
//! every response.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{
    AUTHORIZATION, CACHE_CONTROL, CONTENT_SECURITY_POLICY, COOKIE, HOST, LOCATION, SET_COOKIE,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::state::Shared;

/// The login cookie (its value is the token).
const COOKIE_NAME: &str = "courier_dashboard_token";

/// Only the dashboard's own script, stylesheet and images; no inline script, no framing, forms
/// post only to the dashboard.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Equal in time independent of where the first difference is.
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0_u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn refused(status: StatusCode, text: &'static str) -> Response {
    (
        status,
        [("content-type", "text/plain; charset=utf-8")],
        text,
    )
        .into_response()
}

/// The `token` query parameter, and the query without it.
fn split_token(query: &str) -> (Option<String>, String) {
    let mut token = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.strip_prefix("token=") {
            Some(value) => {
                token = Some(percent_decode(value));
                false
            }
            None => !pair.is_empty(),
        })
        .collect();
    (token, rest.join("&"))
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn presented(headers: &HeaderMap, token: &str) -> bool {
    let bearer = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| same_secret(t.trim(), token));
    let cookie = headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().strip_prefix(COOKIE_NAME)?.strip_prefix('='))
        .any(|t| same_secret(t, token));
    bearer || cookie
}

/// Host check, token check, then the handler; security headers on whatever comes back.
pub(crate) async fn guard(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(allowed) = &shared.options.allowed_hosts {
        let host = request.headers().get(HOST).and_then(|h| h.to_str().ok());
        if !host.is_some_and(|h| allowed.iter().any(|a| a.eq_ignore_ascii_case(h))) {
            return refused(
                StatusCode::FORBIDDEN,
                "this dashboard answers only requests for its loopback address",
            );
        }
    }
    let mut response = match &shared.options.token {
        Some(token) => {
            let (given, rest) = split_token(request.uri().query().unwrap_or(""));
            match given {
                Some(given) if same_secret(&given, token) => {
                    // Log in: the cookie, and the same page without the token in its address.
                    let path = request.uri().path();
                    let target = if rest.is_empty() {
                        path.to_owned()
                    } else {
                        format!("{path}?{rest}")
                    };
                    let cookie =
                        format!("{COOKIE_NAME}={token}; Path=/; HttpOnly; SameSite=Strict");
                    match (
                        HeaderValue::from_str(&target),
                        HeaderValue::from_str(&cookie),
                    ) {
                        (Ok(location), Ok(cookie)) => (
                            StatusCode::SEE_OTHER,
                            [(LOCATION, location), (SET_COOKIE, cookie)],
                        )
                            .into_response(),
                        _ => refused(StatusCode::BAD_REQUEST, "bad address"),
                    }
                }
                Some(_) => refused(StatusCode::UNAUTHORIZED, "wrong dashboard token"),
                None if presented(request.headers(), token) => next.run(request).await,
                None => refused(
                    StatusCode::UNAUTHORIZED,
                    "this dashboard needs its token: open it once with ?token=TOKEN (a cookie \
                     keeps you logged in) or send `Authorization: Bearer TOKEN`",
                ),
            }
        }
        None => next.run(request).await,
    };
    let headers = response.headers_mut();
    headers.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    if !headers.contains_key(CACHE_CONTROL) {
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_taken_out_of_the_query() {
        assert_eq!(
            split_token("status=failed&token=a%2Bb&agent=x"),
            (Some("a+b".to_owned()), "status=failed&agent=x".to_owned())
        );
        assert_eq!(split_token(""), (None, String::new()));
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
    }
}
