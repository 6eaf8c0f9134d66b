//! The `symfony+amqp://user:pass@host:port/vhost/exchange?options` DSN, read as PHP's
//! `Connection::fromDsn` reads `amqp://...`.

use std::sync::Arc;

use courier_core::{
    Dsn, FactoryContext, MessageRegistry, Transport, TransportError, TransportErrorKind,
};
use lapin::uri::{AMQPAuthority, AMQPUri, AMQPUserInfo};

use super::{AmqpOptions, AmqpTransport};
use crate::{SymfonySerializer, SymfonyTypes};

/// The broker's address and the exchange of an `amqp://` or `symfony+amqp://` DSN, as PHP
/// reads them: host (default `localhost`), port (5672), user and password (percent-decoded;
/// default guest / guest), the vhost (the first path segment, percent-decoded; default `/`)
/// and the exchange (the second, default `messages`).
///
/// # Errors
/// The reason, for a scheme other than `amqp` / `symfony+amqp`.
pub fn amqp_uri(dsn: &Dsn) -> Result<(AMQPUri, String), String> {
    if !matches!(dsn.scheme(), "amqp" | "symfony+amqp") {
        return Err(format!(
            "scheme `{}` is not amqp:// (amqps:// is not supported)",
            dsn.scheme()
        ));
    }
    let path = dsn.path().trim_matches('/');
    let mut parts = path.split('/');
    let vhost = match parts.next().filter(|v| !v.is_empty()) {
        Some(v) => percent_decode(v),
        None => "/".to_owned(),
    };
    let exchange = parts
        .next()
        .map_or_else(|| "messages".to_owned(), percent_decode);
    let mut userinfo = AMQPUserInfo::default();
    if let Some(user) = dsn.user().filter(|u| !u.is_empty()) {
        user.clone_into(&mut userinfo.username);
    }
    if let Some(password) = dsn.password() {
        password.clone_into(&mut userinfo.password);
    }
    let uri = AMQPUri {
        authority: AMQPAuthority {
            userinfo,
            host: dsn.host().unwrap_or("localhost").to_owned(),
            port: dsn.port().unwrap_or(5672),
        },
        vhost,
        ..AMQPUri::default()
    };
    Ok((uri, exchange))
}

/// `%xx` decoded (PHP's `urldecode` without `+`); invalid escapes kept as written.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl AmqpTransport {
    /// A transport from a DSN `symfony+amqp://user:pass@host:port/vhost/exchange?options`
    /// (or PHP's own `amqp://...`), with PHP's option names in the query (see
    /// [`AmqpOptions::from_query`]). Connects lazily.
    ///
    /// # Errors
    /// [`TransportErrorKind::Config`] naming the bad option or scheme (never the password).
    pub fn from_dsn(
        name: impl Into<String>,
        dsn: &Dsn,
        serializer: SymfonySerializer,
        registry: Arc<MessageRegistry>,
    ) -> Result<Self, TransportError> {
        let name = name.into();
        let config = |reason: String| {
            TransportError::new(TransportErrorKind::Config, name.clone()).with_context(reason)
        };
        let (uri, exchange) = amqp_uri(dsn).map_err(config)?;
        let options = AmqpOptions::from_query(&exchange, dsn.options()).map_err(config)?;
        Ok(Self::new(name, uri, options, serializer, registry))
    }
}

/// What `SymfonyTransportFactory` builds for `symfony+amqp://`: the transport, connected and
/// (unless `auto_setup` is off) with its exchange and queues declared.
pub(crate) async fn create(
    ctx: &FactoryContext,
    types: &SymfonyTypes,
) -> Result<Arc<dyn Transport>, TransportError> {
    let transport = AmqpTransport::from_dsn(
        ctx.name.clone(),
        &ctx.dsn,
        SymfonySerializer::new(types.clone()),
        ctx.registry.clone(),
    )?;
    if transport.options().auto_setup {
        transport.setup().await?;
    }
    Ok(Arc::new(transport))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phps_reading_of_the_dsn() {
        let dsn = Dsn::parse("symfony+amqp://app:s%2Fcret@rabbit:5673/%2f/emails").expect("dsn");
        let (uri, exchange) = amqp_uri(&dsn).expect("uri");
        assert_eq!(uri.authority.host, "rabbit");
        assert_eq!(uri.authority.port, 5673);
        assert_eq!(uri.authority.userinfo.username, "app");
        assert_eq!(uri.authority.userinfo.password, "s/cret");
        assert_eq!(uri.vhost, "/");
        assert_eq!(exchange, "emails");
        let (uri, exchange) =
            amqp_uri(&Dsn::parse("symfony+amqp://localhost/app").expect("dsn")).expect("uri");
        assert_eq!((uri.vhost.as_str(), exchange.as_str()), ("app", "messages"));
        assert_eq!(uri.authority.port, 5672);
        assert_eq!(uri.authority.userinfo.username, "guest");
    }

    #[test]
    fn errors_name_the_option_never_the_password() {
        let dsn = Dsn::parse("symfony+amqp://app:hunter2@rabbit/%2f/e?queue=x").expect("dsn");
        let err = AmqpTransport::from_dsn(
            "async",
            &dsn,
            SymfonySerializer::default(),
            Arc::new(MessageRegistry::new()),
        )
        .expect_err("unknown option");
        let text = courier_core::error_chain(&err).to_string();
        assert!(text.contains("`queue`"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
        let ok = AmqpTransport::from_dsn(
            "async",
            &Dsn::parse("symfony+amqp://app:hunter2@rabbit/%2f/e").expect("dsn"),
            SymfonySerializer::default(),
            Arc::new(MessageRegistry::new()),
        )
        .expect("transport");
        assert!(!format!("{ok:?}").contains("hunter2"));
    }
}
