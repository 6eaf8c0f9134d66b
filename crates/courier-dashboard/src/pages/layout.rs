//! The page shell (header, navigation, stylesheet, script) and the small pieces every page
//! uses: status badges, times, numbers.

use std::time::{SystemTime, UNIX_EPOCH};

use courier_runs::{RunStatus, rfc3339_ms};
use maud::{DOCTYPE, Markup, html};

/// Which navigation entry is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nav {
    Overview,
    Runs,
    Failed,
    Workers,
    None,
}

/// A whole page.
pub(crate) fn page(title: &str, nav: Nav, body: Markup) -> Markup {
    let link = |href: &str, label: &str, this: Nav| {
        html! { a href=(href) class=[(nav == this).then_some("active")] { (label) } }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Courier" }
                link rel="icon" href="/favicon.ico" type="image/svg+xml";
                link rel="stylesheet" href="/assets/dashboard.css";
                script src="/assets/dashboard.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/" { "Courier" span { "dashboard" } }
                    nav {
                        (link("/", "Overview", Nav::Overview))
                        (link("/runs", "Runs", Nav::Runs))
                        (link("/failed", "Failed messages", Nav::Failed))
                        (link("/workers", "Workers", Nav::Workers))
                    }
                }
                main { (body) }
                footer { "Courier " (env!("CARGO_PKG_VERSION")) " · times in UTC" }
            }
        }
    }
}

/// A run status as a coloured badge.
pub(crate) fn status(s: RunStatus) -> Markup {
    html! { span class={ "badge s-" (s.as_str()) } { (s.as_str().replace('_', " ")) } }
}

/// An epoch-ms time, `2026-12-01 07:51:03`, with the full RFC 3339 time as its `datetime`.
pub(crate) fn time(ms: i64) -> Markup {
    let full = rfc3339_ms(ms);
    let short = full.get(..19).unwrap_or(&full).replace('T', " ");
    html! { time datetime=(full) title=(full) { (short) } }
}

/// An optional epoch-ms time, `–` when absent.
pub(crate) fn time_opt(ms: Option<i64>) -> Markup {
    match ms {
        Some(ms) => time(ms),
        None => html! { span.muted { "–" } },
    }
}

/// Now, epoch ms, by this process's clock.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `12 s ago`, `in 3 min`.
pub(crate) fn relative(ms: i64, now: i64) -> String {
    let delta = now - ms;
    let secs = delta.unsigned_abs() / 1000;
    let span = match secs {
        0..60 => format!("{secs} s"),
        60..3600 => format!("{} min", secs / 60),
        3600..86_400 => format!("{} h", secs / 3600),
        _ => format!("{} d", secs / 86_400),
    };
    if delta >= 0 {
        format!("{span} ago")
    } else {
        format!("in {span}")
    }
}

/// An optional text, `–` when absent.
pub(crate) fn opt(text: Option<&str>) -> Markup {
    match text {
        Some(t) => html! { (t) },
        None => html! { span.muted { "–" } },
    }
}

/// A JSON value, pretty, as text.
pub(crate) fn json(value: &serde_json::Value) -> Markup {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    html! { pre { (text) } }
}
