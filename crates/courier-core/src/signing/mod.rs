//! Signed messages (Symfony Messenger 7.4's signing): an HMAC-SHA256 over a message's type,
//! body and sendable stamps, added on send and checked on receive for the message types
//! configured as signed. A message that is unsigned, signed with a key this process does not
//! have, or changed since it was signed is never handled: the bus refuses it with
//! [`BusError::Signature`](crate::BusError::Signature), which the worker never retries, so it
//! goes straight to the failure transport, with an
//! [`ErrorDetailsStamp`](crate::ErrorDetailsStamp) of class `signature` naming the reason.
//!
//! Keys rotate: the first key signs, every key verifies, so a new key goes first and the old one
//! stays second until the messages it signed are consumed.
//!
//! ```
//! use courier_core::{Envelope, HandlerError, InMemoryTransport, Message, MessageBus, SigningKeys,
//!     SignatureStamp, Signing, Transport};
//! use serde::{Deserialize, Serialize};
//! use std::sync::Arc;
//!
//! #[derive(Serialize, Deserialize)]
//! struct Refund { order: u64 }
//! impl Message for Refund { const NAME: &'static str = "orders.refund"; }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let keys = SigningKeys::new(["a-random-key-of-at-least-32-bytes!!"])?;
//! let queue = Arc::new(InMemoryTransport::new());
//! let bus = MessageBus::builder()
//!     .transport("async", queue.clone())
//!     .route("orders.*", ["async"])
//!     .signing(Signing::new(keys).messages(["orders.*"]))
//!     .handler_fn("refund", |_: Arc<Refund>| async { Ok::<(), HandlerError>(()) })
//!     .build();
//! bus.dispatch(Refund { order: 7 }).await?;
//! assert!(queue.sent()[0].has::<SignatureStamp>());
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```
//!
//! # What is signed
//!
//! The signature covers this byte string (version 1), each field a netstring
//! (`<decimal length>:<bytes>,`):
//!
//! 1. the literal `courier-signature-v1`;
//! 2. the `type` header (the wire name);
//! 3. the body as JSON, the bytes on the wire for a JSON body (a body in another serializer is
//!    covered as its JSON form, so a signature does not depend on the transport's serializer);
//! 4. for every sendable stamp header (`x-courier-stamp-<name>`) in sorted name order, its name
//!    then its value, except the signature's own header and the delivery bookkeeping a worker
//!    rewrites when it retries or moves a message: `delay`, `redelivery`, `error-details`,
//!    `handled` and `sent-to-failure-transport` ([`UNSIGNED_STAMPS`]).
//!
//! The signature travels as the stamp `signature` (`x-courier-stamp-signature:
//! [{"key":"<key id>","hmac":"<hex>"}]`); the key id is the first 8 bytes of SHA-256 over
//! `courier-signing-key-id:` and the key, in hex, so a verifier picks the key without trying each.
//! Add other sendable stamps before the message is dispatched, or in middleware: the bus signs
//! after every middleware. On receive, stamps added after the message was received (by a
//! worker's received hook) are not covered: the check reads the stamps before the envelope's
//! first [`ReceivedStamp`](crate::ReceivedStamp), the ones it came with.

mod canonical;
mod config;
mod middleware;

use std::fmt;

use hmac::Mac;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

pub use canonical::{UNSIGNED_STAMPS, signing_input};
pub use config::SigningConfig;
pub use middleware::Signing;

use crate::Stamp;

/// The shortest key accepted, in bytes.
pub const MIN_KEY_BYTES: usize = 32;

/// The signature of a message: the id of the key that made it and the HMAC-SHA256 in hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignatureStamp {
    /// The signing key's id (see the [module docs](self)).
    pub key: String,
    /// HMAC-SHA256 over the [`signing_input`], lowercase hex.
    pub hmac: String,
}

impl Stamp for SignatureStamp {
    const NAME: &'static str = "signature";
}

/// Why a message's signature does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignatureError {
    /// The message type is signed, and the message carries no signature.
    #[error("the message is not signed")]
    Missing,
    /// Signed with a key this process does not have.
    #[error("signed with an unknown key `{key_id}`")]
    UnknownKey {
        /// The key id the signature names.
        key_id: String,
    },
    /// The signature does not match: the body or a signed stamp changed since signing.
    #[error("the signature does not match the body and stamps (changed since signing)")]
    Mismatch,
    /// The signature stamp is not a hex HMAC-SHA256.
    #[error("the signature is malformed")]
    Malformed,
    /// The message could not be encoded to compute its signature.
    #[error("the message cannot be encoded to check its signature")]
    Encode,
}

/// Keys that sign and verify: the first signs, all verify (rotation). `Debug` shows key ids,
/// never keys.
#[derive(Clone)]
pub struct SigningKeys {
    keys: Vec<Key>,
}

#[derive(Clone)]
struct Key {
    id: String,
    secret: Vec<u8>,
}

/// A key list that cannot sign.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SigningKeyError {
    /// No key was given (empty entries do not count).
    #[error("no signing key (give at least one non-empty key)")]
    NoKey,
    /// A key is shorter than [`MIN_KEY_BYTES`].
    #[error(
        "signing key {position} is {len} bytes long, shorter than the minimum of {MIN_KEY_BYTES}"
    )]
    TooShort {
        /// Its place in the list, from 1.
        position: usize,
        /// Its length.
        len: usize,
    },
}

impl SigningKeys {
    /// Keys from their text (the first signs). Empty entries are skipped, so an unset
    /// `${OLD_KEY:-}` in a config leaves no hole.
    ///
    /// # Errors
    /// [`SigningKeyError`]: no key, or a key shorter than [`MIN_KEY_BYTES`].
    pub fn new<I, S>(keys: I) -> Result<Self, SigningKeyError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[u8]>,
    {
        let mut out = Vec::new();
        for (i, key) in keys.into_iter().enumerate() {
            let secret = key.as_ref();
            if secret.is_empty() {
                continue;
            }
            if secret.len() < MIN_KEY_BYTES {
                return Err(SigningKeyError::TooShort {
                    position: i + 1,
                    len: secret.len(),
                });
            }
            out.push(Key {
                id: key_id(secret),
                secret: secret.to_vec(),
            });
        }
        if out.is_empty() {
            return Err(SigningKeyError::NoKey);
        }
        Ok(Self { keys: out })
    }

    /// The ids of the keys, signing key first.
    pub fn ids(&self) -> impl Iterator<Item = &str> + '_ {
        self.keys.iter().map(|k| k.id.as_str())
    }

    /// Signs `input` with the first key.
    #[must_use]
    pub fn sign(&self, input: &[u8]) -> SignatureStamp {
        let key = &self.keys[0];
        SignatureStamp {
            key: key.id.clone(),
            hmac: hex(&mac(&key.secret, input)),
        }
    }

    /// Checks a signature over `input`.
    ///
    /// # Errors
    /// [`SignatureError::UnknownKey`], [`SignatureError::Malformed`] or
    /// [`SignatureError::Mismatch`].
    pub fn verify(&self, input: &[u8], signature: &SignatureStamp) -> Result<(), SignatureError> {
        let Some(key) = self.keys.iter().find(|k| k.id == signature.key) else {
            return Err(SignatureError::UnknownKey {
                key_id: signature.key.clone(),
            });
        };
        let Some(expected) = unhex(&signature.hmac) else {
            return Err(SignatureError::Malformed);
        };
        let mut m = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(&key.secret)
            .map_err(|_| SignatureError::Malformed)?;
        m.update(input);
        m.verify_slice(&expected)
            .map_err(|_| SignatureError::Mismatch)
    }
}

impl fmt::Debug for SigningKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKeys")
            .field("ids", &self.ids().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

fn mac(secret: &[u8], input: &[u8]) -> Vec<u8> {
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    match <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(secret) {
        Ok(mut m) => {
            m.update(input);
            m.finalize().into_bytes().to_vec()
        }
        Err(_) => Vec::new(),
    }
}

fn key_id(secret: &[u8]) -> String {
    let mut h = sha2::Sha256::new();
    h.update(b"courier-signing-key-id:");
    h.update(secret);
    hex(&h.finalize()[..8])
}

fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    s
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() != 64 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    text.as_bytes()
        .chunks(2)
        .map(|p| Some((digit(p[0])? << 4) | digit(p[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "0123456789abcdef0123456789abcdef-one";
    const K2: &str = "0123456789abcdef0123456789abcdef-two";

    #[test]
    fn the_first_key_signs_and_every_key_verifies() {
        let old = SigningKeys::new([K1]).unwrap_or_else(|e| panic!("{e}"));
        let rotated = SigningKeys::new([K2, K1]).unwrap_or_else(|e| panic!("{e}"));
        let by_old = old.sign(b"x");
        assert_eq!(rotated.verify(b"x", &by_old), Ok(()));
        let by_new = rotated.sign(b"x");
        assert_ne!(by_new.key, by_old.key);
        assert_eq!(
            old.verify(b"x", &by_new),
            Err(SignatureError::UnknownKey {
                key_id: by_new.key.clone()
            })
        );
        assert_eq!(rotated.verify(b"y", &by_new), Err(SignatureError::Mismatch));
    }

    #[test]
    fn keys_never_show_in_debug_and_short_keys_are_refused() {
        let keys = SigningKeys::new([K1, ""]).unwrap_or_else(|e| panic!("{e}"));
        let s = format!("{keys:?}");
        assert!(!s.contains("0123456789abcdef0123"), "{s}");
        assert_eq!(keys.ids().count(), 1);
        assert!(matches!(
            SigningKeys::new(["short"]),
            Err(SigningKeyError::TooShort { position: 1, .. })
        ));
        assert!(matches!(
            SigningKeys::new([""; 2]),
            Err(SigningKeyError::NoKey)
        ));
    }

    #[test]
    fn a_signature_that_is_not_hex_is_malformed() {
        let keys = SigningKeys::new([K1]).unwrap_or_else(|e| panic!("{e}"));
        let mut sig = keys.sign(b"x");
        sig.hmac = "zz".repeat(32);
        assert_eq!(keys.verify(b"x", &sig), Err(SignatureError::Malformed));
    }
}
