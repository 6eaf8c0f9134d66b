//! [`KeyPath`]: where a message's concurrency key is found in its JSON body.

/// A JSON path to a string field of a message body (`$.tenant_id`, `$.customer.id`): object
/// members only, each name 1 to 64 ASCII letters, digits, `_` or `-`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPath {
    path: String,
    members: Vec<String>,
}

impl KeyPath {
    /// Parses `$.name(.name)*`.
    ///
    /// # Errors
    /// A message naming the path and what a path looks like.
    pub fn parse(path: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "concurrency_key `{path}`: expected a JSON path to a string field of the body, \
                 like `$.tenant_id` or `$.customer.id` (object members of letters, digits, `_`, `-`)"
            )
        };
        let rest = path.strip_prefix("$.").ok_or_else(bad)?;
        let members: Vec<String> = rest.split('.').map(str::to_owned).collect();
        let valid = |m: &String| {
            !m.is_empty()
                && m.len() <= 64
                && m.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        };
        if !members.iter().all(valid) {
            return Err(bad());
        }
        Ok(Self {
            path: path.to_owned(),
            members,
        })
    }

    /// The path as written.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.path
    }

    /// The key this path finds in a JSON body.
    ///
    /// # Errors
    /// A message saying the field is missing, is not a string, or is not a valid key (empty or
    /// longer than 200 bytes), or that the body is not a JSON object.
    pub fn find(&self, body: &str) -> Result<crate::ConcurrencyKeyStamp, String> {
        let value: serde_json::Value = serde_json::from_str(body).map_err(|e| {
            format!(
                "concurrency_key `{}`: the body is not JSON ({e})",
                self.path
            )
        })?;
        let mut at = &value;
        for m in &self.members {
            at = at.get(m.as_str()).ok_or_else(|| {
                format!("concurrency_key `{}`: missing from the message", self.path)
            })?;
        }
        let serde_json::Value::String(key) = at else {
            return Err(format!(
                "concurrency_key `{}`: expected a string, found {}",
                self.path,
                json_kind(at)
            ));
        };
        crate::ConcurrencyKeyStamp::new(key.as_str())
            .map_err(|e| format!("concurrency_key `{}`: {e}", self.path))
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}
