//! A reader of PHP's `serialize()` format, enough for Messenger's `PhpSerializer` envelopes:
//! scalars, strings, arrays, objects and enums. It reads only: Courier never writes this format.
//! References (`r:`/`R:`) and custom `Serializable` payloads (`C:`) are refused.

use std::fmt;

/// The deepest nesting read; deeper input is refused rather than risking the stack.
const MAX_DEPTH: usize = 64;

/// A value read from PHP's `serialize()` format.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PhpValue {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// PHP strings are bytes.
    Str(Vec<u8>),
    /// An array: its keys (integers or strings) and values, in order.
    Array(Vec<(PhpKey, PhpValue)>),
    /// An object: its class and properties, in order, with their raw names (a private property
    /// is `\0Class\0name`, a protected one `\0*\0name`).
    Object {
        class: String,
        props: Vec<(Vec<u8>, PhpValue)>,
    },
    /// An enum case: `Class:Case`.
    Enum {
        class: String,
        case: String,
    },
}

/// An array key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PhpKey {
    Int(i64),
    Str(Vec<u8>),
}

impl PhpValue {
    /// The property of an object by its name without the visibility prefix.
    pub(crate) fn prop(&self, name: &str) -> Option<&PhpValue> {
        let PhpValue::Object { props, .. } = self else {
            return None;
        };
        props
            .iter()
            .find(|(raw, _)| prop_name(raw) == name.as_bytes())
            .map(|(_, v)| v)
    }
}

/// A property's name without its visibility prefix (`\0Class\0` or `\0*\0`).
pub(crate) fn prop_name(raw: &[u8]) -> &[u8] {
    if raw.first() == Some(&0)
        && let Some(end) = raw[1..].iter().position(|&b| b == 0)
    {
        return &raw[end + 2..];
    }
    raw
}

/// Why PHP serialize data could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid PHP serialize data at byte {offset}: {reason}")]
pub struct PhpSerializeError {
    /// Where reading stopped.
    pub offset: usize,
    /// What was expected there.
    pub reason: &'static str,
}

/// Reads one value that must span all of `input`.
pub(crate) fn unserialize(input: &[u8]) -> Result<PhpValue, PhpSerializeError> {
    let mut reader = Reader { input, pos: 0 };
    let value = reader.value(0)?;
    if reader.pos != input.len() {
        return Err(reader.error("trailing bytes after the value"));
    }
    Ok(value)
}

struct Reader<'a> {
    input: &'a [u8],
    pos: usize,
}

impl fmt::Debug for Reader<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reader").field("pos", &self.pos).finish()
    }
}

impl Reader<'_> {
    fn error(&self, reason: &'static str) -> PhpSerializeError {
        PhpSerializeError {
            offset: self.pos,
            reason,
        }
    }

    fn expect(&mut self, byte: u8, reason: &'static str) -> Result<(), PhpSerializeError> {
        if self.input.get(self.pos) == Some(&byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.error(reason))
        }
    }

    /// The text up to (not including) `end`, which is consumed.
    fn until(&mut self, end: u8, reason: &'static str) -> Result<&str, PhpSerializeError> {
        let rest = &self.input[self.pos..];
        let len = rest
            .iter()
            .position(|&b| b == end)
            .ok_or_else(|| self.error(reason))?;
        let text = std::str::from_utf8(&rest[..len]).map_err(|_| self.error(reason))?;
        self.pos += len + 1;
        Ok(text)
    }

    fn int(&mut self, end: u8) -> Result<i64, PhpSerializeError> {
        let at = self.pos;
        let text = self.until(end, "an integer")?;
        text.parse().map_err(|_| PhpSerializeError {
            offset: at,
            reason: "an integer",
        })
    }

    fn len(&mut self, end: u8) -> Result<usize, PhpSerializeError> {
        let at = self.pos;
        let n = self.int(end)?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.input.len())
            .ok_or(PhpSerializeError {
                offset: at,
                reason: "a length within the input",
            })
    }

    /// `"<len bytes>"` after its length was read.
    fn quoted(&mut self, len: usize) -> Result<Vec<u8>, PhpSerializeError> {
        self.expect(b'"', "an opening quote")?;
        let end = self
            .pos
            .checked_add(len)
            .filter(|&e| e <= self.input.len())
            .ok_or_else(|| self.error("a string within the input"))?;
        let bytes = self.input[self.pos..end].to_vec();
        self.pos = end;
        self.expect(b'"', "a closing quote")?;
        Ok(bytes)
    }

    fn text(&mut self, len: usize) -> Result<String, PhpSerializeError> {
        let at = self.pos;
        String::from_utf8(self.quoted(len)?).map_err(|_| PhpSerializeError {
            offset: at,
            reason: "a UTF-8 class name",
        })
    }

    fn value(&mut self, depth: usize) -> Result<PhpValue, PhpSerializeError> {
        if depth > MAX_DEPTH {
            return Err(self.error("nesting within 64 levels"));
        }
        let tag = *self
            .input
            .get(self.pos)
            .ok_or_else(|| self.error("a value"))?;
        self.pos += 1;
        if tag == b'N' {
            self.expect(b';', "`;` after N")?;
            return Ok(PhpValue::Null);
        }
        self.expect(b':', "`:` after the type")?;
        match tag {
            b'b' => Ok(PhpValue::Bool(self.int(b';')? != 0)),
            b'i' => Ok(PhpValue::Int(self.int(b';')?)),
            b'd' => {
                let at = self.pos;
                let text = self.until(b';', "a float")?;
                let value = match text {
                    "INF" => f64::INFINITY,
                    "-INF" => f64::NEG_INFINITY,
                    "NAN" => f64::NAN,
                    t => t.parse().map_err(|_| PhpSerializeError {
                        offset: at,
                        reason: "a float",
                    })?,
                };
                Ok(PhpValue::Float(value))
            }
            b's' => {
                let len = self.len(b':')?;
                let bytes = self.quoted(len)?;
                self.expect(b';', "`;` after a string")?;
                Ok(PhpValue::Str(bytes))
            }
            b'a' => {
                let n = self.len(b':')?;
                self.expect(b'{', "`{` opening an array")?;
                let mut items = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    let key = match self.value(depth + 1)? {
                        PhpValue::Int(i) => PhpKey::Int(i),
                        PhpValue::Str(s) => PhpKey::Str(s),
                        _ => return Err(self.error("an integer or string array key")),
                    };
                    items.push((key, self.value(depth + 1)?));
                }
                self.expect(b'}', "`}` closing an array")?;
                Ok(PhpValue::Array(items))
            }
            b'O' => {
                let len = self.len(b':')?;
                let class = self.text(len)?;
                self.expect(b':', "`:` after the class")?;
                let n = self.len(b':')?;
                self.expect(b'{', "`{` opening an object")?;
                let mut props = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    let PhpValue::Str(name) = self.value(depth + 1)? else {
                        return Err(self.error("a string property name"));
                    };
                    props.push((name, self.value(depth + 1)?));
                }
                self.expect(b'}', "`}` closing an object")?;
                Ok(PhpValue::Object { class, props })
            }
            b'E' => {
                let len = self.len(b':')?;
                let at = self.pos;
                let text = self.text(len)?;
                self.expect(b';', "`;` after an enum")?;
                let (class, case) = text.split_once(':').ok_or(PhpSerializeError {
                    offset: at,
                    reason: "an enum as `Class:Case`",
                })?;
                Ok(PhpValue::Enum {
                    class: class.to_owned(),
                    case: case.to_owned(),
                })
            }
            _ => Err(PhpSerializeError {
                offset: self.pos - 2,
                reason: "a value of type N, b, i, d, s, a, O or E (references and C: are not read)",
            }),
        }
    }
}

/// PHP's `stripslashes`: drops each backslash, keeping the byte after it, and reads `\0` as a
/// NUL byte.
pub(crate) fn stripslashes(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len());
    let mut bytes = input.iter();
    while let Some(&b) = bytes.next() {
        if b == b'\\' {
            match bytes.next() {
                Some(b'0') => out.push(0),
                Some(&next) => out.push(next),
                None => {}
            }
        } else {
            out.push(b);
        }
    }
    out
}

/// Standard base64 (with or without padding; whitespace skipped), as PHP's `base64_encode`
/// writes it; `None` on any other byte.
pub(crate) fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for b in text.bytes() {
        let v = match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' | b'\n' | b'\r' | b' ' => continue,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(((acc >> bits) & 0xff) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_arrays_objects_and_enums_are_read() {
        let input = br#"O:3:"Foo":4:{s:1:"a";i:-5;s:4:" * b";a:2:{i:0;b:1;s:1:"k";d:1.5;}s:6:" Foo c";N;s:1:"e";E:8:"Prio:Low";}"#;
        let input: Vec<u8> = input
            .iter()
            .map(|&b| if b == b' ' { 0 } else { b })
            .collect();
        let value = unserialize(&input).expect("valid input");
        assert_eq!(value.prop("a"), Some(&PhpValue::Int(-5)));
        assert_eq!(
            value.prop("b"),
            Some(&PhpValue::Array(vec![
                (PhpKey::Int(0), PhpValue::Bool(true)),
                (PhpKey::Str(b"k".to_vec()), PhpValue::Float(1.5)),
            ]))
        );
        assert_eq!(value.prop("c"), Some(&PhpValue::Null));
        assert_eq!(
            value.prop("e"),
            Some(&PhpValue::Enum {
                class: "Prio".into(),
                case: "Low".into()
            })
        );
    }

    #[test]
    fn a_string_is_read_by_its_byte_length() {
        assert_eq!(
            unserialize(b"s:5:\"a\"b;c\";"),
            Ok(PhpValue::Str(b"a\"b;c".to_vec()))
        );
    }

    #[test]
    fn bad_input_is_refused_with_its_offset() {
        assert_eq!(unserialize(b"s:9:\"ab\";").map_err(|e| e.offset), Err(5));
        assert!(unserialize(b"r:1;").is_err());
        assert!(unserialize(b"i:1;x").is_err());
        let deep = "a:1:{i:0;".repeat(100);
        assert!(unserialize(deep.as_bytes()).is_err());
    }

    #[test]
    fn stripslashes_and_base64_undo_what_php_wrote() {
        assert_eq!(stripslashes(br#"a\"b\\c\0d"#), b"a\"b\\c\0d".to_vec());
        assert_eq!(base64_decode("aGk/Pz8+").as_deref(), Some(&b"hi???>"[..]));
        assert_eq!(base64_decode("a!"), None);
    }
}
