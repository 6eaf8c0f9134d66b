//! The signing step of the bus: signs outgoing messages, checks received ones.

use std::sync::Arc;

use async_trait::async_trait;

use super::{SignatureError, SignatureStamp, SigningKeys, signing_input};
use crate::{BusError, Envelope, Middleware, Next, ReceivedStamp, Router};

/// Signs outgoing messages of the signed types and checks received ones; give it to
/// [`MessageBusBuilder::signing`](crate::MessageBusBuilder::signing), which runs it after every
/// middleware, so stamps added there are signed too. See the [module docs](crate::signing).
#[derive(Debug, Clone)]
pub struct Signing {
    keys: Arc<SigningKeys>,
    signed: Router,
}

impl Signing {
    /// Signs and checks every message with `keys` (narrow it with [`Signing::messages`]).
    #[must_use]
    pub fn new(keys: SigningKeys) -> Self {
        Self {
            keys: Arc::new(keys),
            signed: Router::new().route("*", ["signed"]),
        }
    }

    /// Signs and checks only the messages whose wire names match `patterns` (exact names,
    /// `prefix.*`, or `*`, as in routing).
    #[must_use]
    pub fn messages<I, S>(mut self, patterns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut router = Router::new();
        for p in patterns {
            router = router.route(p.as_ref(), ["signed"]);
        }
        self.signed = router;
        self
    }

    /// Whether messages named `name` are signed.
    #[must_use]
    pub fn signs(&self, name: &str) -> bool {
        !self.signed.resolve(name).is_empty()
    }

    /// The keys.
    #[must_use]
    pub fn keys(&self) -> &SigningKeys {
        &self.keys
    }

    /// Signs an outgoing envelope (replacing any signature it has).
    ///
    /// # Errors
    /// [`BusError::Signature`] with [`SignatureError::Encode`] when the message does not
    /// serialize.
    pub fn sign(&self, envelope: Envelope) -> Result<Envelope, BusError> {
        let envelope = envelope.without_all::<SignatureStamp>();
        let input = signing_input(&envelope).map_err(|_| BusError::Signature {
            name: envelope.message_name().to_owned(),
            reason: SignatureError::Encode,
        })?;
        let signature = self.keys.sign(&input);
        Ok(envelope.with(signature))
    }

    /// Checks a received envelope's signature.
    ///
    /// # Errors
    /// [`BusError::Signature`] naming why it does not verify.
    pub fn verify(&self, envelope: &Envelope) -> Result<(), BusError> {
        let refuse = |reason| BusError::Signature {
            name: envelope.message_name().to_owned(),
            reason,
        };
        let Some(signature) = envelope.last::<SignatureStamp>() else {
            return Err(refuse(if envelope.has::<SignatureStamp>() {
                SignatureError::Malformed
            } else {
                SignatureError::Missing
            }));
        };
        let input = signing_input(envelope).map_err(|_| refuse(SignatureError::Encode))?;
        self.keys.verify(&input, signature).map_err(refuse)
    }
}

#[async_trait]
impl Middleware for Signing {
    async fn handle(&self, envelope: Envelope, next: Next<'_>) -> Result<Envelope, BusError> {
        if envelope.decode_error().is_some() || !self.signs(envelope.message_name()) {
            return next.run(envelope).await;
        }
        if envelope.has::<ReceivedStamp>() {
            if let Err(e) = self.verify(&envelope) {
                tracing::warn!(error = %crate::error_chain(&e), "refused a message whose signature does not verify");
                return Err(e);
            }
            return next.run(envelope).await;
        }
        let signed = self.sign(envelope)?;
        next.run(signed).await
    }
}
