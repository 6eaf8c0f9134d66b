//! The `[signing]` table of `courier.toml`.

use std::fmt;

use serde::Deserialize;

use super::{Signing, SigningKeys};

/// The `[signing]` table: the keys (the first signs, all verify) and the wire names whose
/// messages are signed (exact names, `prefix.*`, or `*`; default every message).
///
/// ```toml
/// [signing]
/// keys = ["${COURIER_SIGNING_KEY}", "${COURIER_SIGNING_KEY_OLD:-}"]
/// messages = ["orders.*"]
/// ```
///
/// Keys are checked when the file is read (at least 32 bytes each; empty entries are skipped)
/// and never shown: `Debug` prints their ids only.
#[derive(Clone, Deserialize)]
#[serde(try_from = "RawSigningConfig")]
pub struct SigningConfig {
    signing: Signing,
    messages: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSigningConfig {
    keys: Vec<String>,
    #[serde(default = "every_message")]
    messages: Vec<String>,
}

fn every_message() -> Vec<String> {
    vec!["*".to_owned()]
}

impl TryFrom<RawSigningConfig> for SigningConfig {
    type Error = String;

    fn try_from(raw: RawSigningConfig) -> Result<Self, String> {
        let keys = SigningKeys::new(&raw.keys).map_err(|e| format!("signing.keys: {e}"))?;
        Ok(Self {
            signing: Signing::new(keys).messages(&raw.messages),
            messages: raw.messages,
        })
    }
}

impl SigningConfig {
    /// The bus step the table describes.
    #[must_use]
    pub fn signing(&self) -> &Signing {
        &self.signing
    }

    /// The signed wire-name patterns.
    #[must_use]
    pub fn messages(&self) -> &[String] {
        &self.messages
    }
}

impl fmt::Debug for SigningConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningConfig")
            .field("key_ids", &self.signing.keys().ids().collect::<Vec<_>>())
            .field("messages", &self.messages)
            .finish()
    }
}
