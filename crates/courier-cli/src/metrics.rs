//! `courier consume --metrics ADDR`: the Prometheus exporter.
//!
//! The application side of the metrics facade: it installs `metrics-exporter-prometheus`'s
//! recorder (the libraries only emit) and serves its text rendering on `GET /metrics` with a
//! small HTTP/1.1 responder on a tokio listener (no HTTP framework: one route, one response,
//! `Connection: close`). While it serves, the queue depth of every consumed transport is sampled
//! every [`DEPTH_EVERY`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use courier_core::{CancellationToken, Transport};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::error::{CliError, CliResult};

/// How often the queue depth is sampled (and the recorder's upkeep runs).
pub(crate) const DEPTH_EVERY: Duration = Duration::from_secs(5);

/// The longest request head read; past it the request is refused.
const MAX_HEAD: usize = 8 * 1024;

/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The exporter, bound and installed, not serving yet.
pub(crate) struct Exporter {
    listener: TcpListener,
    handle: PrometheusHandle,
}

impl Exporter {
    /// Binds `addr` and installs the Prometheus recorder as the process's global recorder.
    ///
    /// # Errors
    /// A usage error when the address cannot be bound or a recorder is already installed.
    pub(crate) async fn bind(addr: SocketAddr) -> CliResult<Self> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| CliError::usage(format!("--metrics {addr}: cannot listen: {e}")))?;
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder).map_err(|_| {
            CliError::usage("--metrics: a metrics recorder is already installed in this process")
        })?;
        courier_core::metrics::describe();
        Ok(Self { listener, handle })
    }

    /// Serves `GET /metrics` and samples the queue depth of `transports` until `stop`.
    pub(crate) fn spawn(
        self,
        transports: Vec<(String, Arc<dyn Transport>)>,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let Self { listener, handle } = self;
        tokio::spawn(async move {
            let depth =
                courier_core::metrics::spawn_queue_depth(transports, DEPTH_EVERY, stop.clone());
            let mut upkeep = tokio::time::interval(DEPTH_EVERY);
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = upkeep.tick() => handle.run_upkeep(),
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => {
                            let handle = handle.clone();
                            tokio::spawn(async move {
                                if let Err(e) = respond(stream, &handle).await {
                                    tracing::debug!(error = %e, "metrics request failed");
                                }
                            });
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "metrics listener: accept failed");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    },
                }
            }
            let _ = depth.await;
        })
    }
}

/// Reads one request head and answers it: `GET /metrics` (or `HEAD`) gets the rendering,
/// another path 404, another method 405, a head that is too long or malformed 400.
async fn respond(mut stream: TcpStream, handle: &PrometheusHandle) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0_u8; 1024];
    let complete = tokio::time::timeout(READ_TIMEOUT, async {
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Ok::<bool, std::io::Error>(false);
            }
            head.extend_from_slice(&buf[..n]);
            if head.windows(4).any(|w| w == b"\r\n\r\n") {
                return Ok(true);
            }
            if head.len() > MAX_HEAD {
                return Ok(false);
            }
        }
    })
    .await
    .unwrap_or(Ok(false))?;
    let line = head
        .split(|b| *b == b'\n')
        .next()
        .map(|l| String::from_utf8_lossy(l).trim_end().to_owned())
        .unwrap_or_default();
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next(), parts.next(), parts.next());
    let response = match (complete, method, target, version) {
        (true, Some(m @ ("GET" | "HEAD")), Some(target), Some(v)) if v.starts_with("HTTP/1.") => {
            let path = target.split('?').next().unwrap_or(target);
            if path == "/metrics" {
                let body = handle.render();
                reply(
                    "200 OK",
                    "text/plain; version=0.0.4; charset=utf-8",
                    &body,
                    m == "HEAD",
                )
            } else {
                reply(
                    "404 Not Found",
                    "text/plain",
                    "not found: try /metrics\n",
                    false,
                )
            }
        }
        (true, Some(_), Some(_), Some(v)) if v.starts_with("HTTP/1.") => {
            reply("405 Method Not Allowed", "text/plain", "GET only\n", false)
        }
        _ => reply("400 Bad Request", "text/plain", "bad request\n", false),
    };
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

fn reply(status: &str, content_type: &str, body: &str, head_only: bool) -> String {
    let allow = if status.starts_with("405") {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n{}",
        body.len(),
        if head_only { "" } else { body }
    )
}
