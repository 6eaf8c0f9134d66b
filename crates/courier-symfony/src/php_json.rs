//! JSON text as PHP's `json_encode` writes it (its default flags): `/` as `\/` and every
//! character beyond ASCII as `\uXXXX` (a UTF-16 surrogate pair beyond the BMP).

use std::borrow::Cow;

/// Rewrites valid JSON text with PHP's escapes: serde_json's output, or text PHP wrote (kept
/// as read), which holds `\/` already. Outside strings, valid JSON holds neither `/` nor
/// non-ASCII characters, so each character is rewritten where it stands; the character after a
/// backslash is an escape and stays as it is.
pub(crate) fn php_escape(json: String) -> String {
    match php_escaped(&json) {
        Cow::Borrowed(_) => json,
        Cow::Owned(escaped) => escaped,
    }
}

/// [`php_escape`] of borrowed text: borrowed back when nothing needs escaping.
pub(crate) fn php_escaped(json: &str) -> Cow<'_, str> {
    if plain_run(json.as_bytes(), Escapes::Php) == json.len() {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + json.len() / 8);
    let bytes = json.as_bytes();
    // Bytes are scanned, runs of plain ASCII copied whole; a backslash's next character is an
    // escape and stays as it is.
    let (mut plain, mut i) = (0, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 1 + json[i + 1..].chars().next().map_or(0, char::len_utf8),
            b'/' => {
                out.push_str(&json[plain..i]);
                out.push_str("\\/");
                i += 1;
                plain = i;
            }
            b if b.is_ascii() => i += 1,
            _ => {
                out.push_str(&json[plain..i]);
                let c = json[i..].chars().next().unwrap_or_default();
                push_units(&mut out, c);
                i += c.len_utf8().max(1);
                plain = i;
            }
        }
    }
    out.push_str(json.get(plain..).unwrap_or_default());
    Cow::Owned(out)
}

/// Appends `c` as `json_encode` writes a character beyond ASCII or a control character: its
/// UTF-16 units as `\uxxxx`.
fn push_units(out: &mut String, c: char) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut units = [0u16; 2];
    for &u in c.encode_utf16(&mut units).iter() {
        out.push_str("\\u");
        for shift in [12, 8, 4, 0] {
            out.push(char::from(HEX[usize::from((u >> shift) & 0xf)]));
        }
    }
}

/// A JSON string literal as `json_encode` writes it.
pub(crate) fn php_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    push_php_string(&mut out, s);
    out
}

/// Appends `s` to `out` as a JSON string literal as `json_encode` writes it: serde_json's
/// escapes (`\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, other control characters as
/// `\u00xx`), then PHP's (`/` as `\/`, beyond ASCII as `\uxxxx`), in one pass.
pub(crate) fn push_php_string(out: &mut String, s: &str) {
    out.reserve(s.len() + s.len() / 8 + 2);
    out.push('"');
    let bytes = s.as_bytes();
    // Bytes are scanned, runs of plain ASCII copied whole (a character beyond ASCII starts with
    // a byte of 0x80 or more, and is decoded there).
    let (mut plain, mut i) = (0, 0);
    while i < bytes.len() {
        i += plain_run(&bytes[i..], Escapes::String);
        let Some(&b) = bytes.get(i) else {
            break;
        };
        out.push_str(&s[plain..i]);
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'/' => "\\/",
            0x08 => "\\b",
            0x0c => "\\f",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            _ => "",
        };
        if escape.is_empty() {
            let c = s[i..].chars().next().unwrap_or_default();
            push_units(out, c);
            i += c.len_utf8().max(1);
        } else {
            out.push_str(escape);
            i += 1;
        }
        plain = i;
    }
    out.push_str(s.get(plain..).unwrap_or_default());
    out.push('"');
}

/// Which bytes end a run of plain text.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Escapes {
    /// Inside a JSON string literal ([`NEEDS_ESCAPE`]): control characters, `"`, `\`, `/` and
    /// bytes beyond ASCII.
    String,
    /// In JSON text [`php_escape`] rewrites: `/` and bytes beyond ASCII.
    Php,
}

/// How many bytes at the start of `bytes` stand as they are (see [`Escapes`]): eight bytes at a
/// time while none of them is one to escape, then byte by byte.
fn plain_run(bytes: &[u8], escapes: Escapes) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // Non-zero when some byte of `x` is zero (never zero when one is; the usual bit trick).
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let has = |x: u64, b: u8| has_zero(x ^ (ONES * u64::from(b)));
    let mut i = 0;
    while let Some(chunk) = bytes.get(i..i + 8) {
        let mut word = [0; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word);
        let mut stop = (x & HIGH) | has(x, b'/');
        if escapes == Escapes::String {
            // A byte below 0x20 (bytes of 0x80 or more are caught above).
            stop |= x.wrapping_sub(ONES * 0x20) & !x & HIGH;
            stop |= has(x, b'"') | has(x, b'\\');
        }
        if stop != 0 {
            break;
        }
        i += 8;
    }
    let table = |b: u8| match escapes {
        Escapes::String => NEEDS_ESCAPE[usize::from(b)],
        Escapes::Php => b == b'/' || !b.is_ascii(),
    };
    i + bytes[i..].iter().take_while(|&&b| !table(b)).count()
}

/// The bytes a JSON string literal as `json_encode` writes it does not hold as they are:
/// control characters, `"`, `\\`, `/`, and every byte of a character beyond ASCII.
const NEEDS_ESCAPE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = b < 0x20
            || b >= 0x80
            || b == b'"' as usize
            || b == b'\\' as usize
            || b == b'/' as usize;
        b += 1;
    }
    table
};

/// A JSON object of string values in this order, as `json_encode` writes a PHP array of strings
/// (`[]` when empty, as PHP writes an empty array).
pub(crate) fn php_object<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::with_capacity(128);
    push_php_object(&mut out, pairs);
    out
}

/// Appends [`php_object`]'s text to `out`.
pub(crate) fn push_php_object<'a>(
    out: &mut String,
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) {
    let start = out.len();
    out.push('{');
    for (key, value) in pairs {
        if out.len() > start + 1 {
            out.push(',');
        }
        push_php_string(out, key);
        out.push(':');
        push_php_string(out, value);
    }
    if out.len() == start + 1 {
        out.truncate(start);
        out.push_str("[]");
    } else {
        out.push('}');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slashes_and_non_ascii_are_escaped_as_php_does() {
        assert_eq!(
            php_escape(r#"{"a":"Grüße/€ 😀"}"#.to_owned()),
            r#"{"a":"Gr\u00fc\u00dfe\/\u20ac \ud83d\ude00"}"#
        );
        assert_eq!(php_escape(r#"{"n":1.5}"#.to_owned()), r#"{"n":1.5}"#);
        assert_eq!(
            php_escape(r#"{"a/b":"€","c":["\"x/\\"]}"#.to_owned()),
            r#"{"a\/b":"\u20ac","c":["\"x\/\\"]}"#
        );
    }

    #[test]
    fn text_php_already_escaped_is_kept() {
        assert_eq!(
            php_escape(r#"{"a":"x\/y\\/z"}"#.to_owned()),
            r#"{"a":"x\/y\\\/z"}"#
        );
    }

    #[test]
    fn a_string_is_escaped_as_serde_json_then_php_do() {
        for s in [
            "plain",
            "",
            "q\"b\\s/\u{8}\u{c}\n\r\t\u{1}\u{1f}\u{7f}",
            "Grüße/€ 😀 end",
            "\u{7f}\u{80}\u{ffff}\u{10000}",
            "€",
            "plain run, then \"quoted\" and a\\b/c€😀\u{1}\n, then a plain run again",
        ] {
            assert_eq!(
                php_string(s),
                php_escape(serde_json::Value::from(s).to_string()),
                "{s:?}"
            );
        }
    }

    /// Runs of plain text are skipped eight bytes at a time: every byte to escape is found
    /// wherever it stands in the word (and in the bytes after the last whole word).
    #[test]
    fn an_escape_is_found_at_every_position() {
        let base = "abcdefghijklmnopqrstuvwxyz";
        for special in [
            "\"", "\\", "/", "\n", "\u{1}", "\u{1f}", "\u{7f}", "é", "€", "😀",
        ] {
            for at in 0..=base.len() {
                let s = format!("{}{special}{}", &base[..at], &base[at..]);
                let json = serde_json::Value::from(s.as_str()).to_string();
                assert_eq!(php_string(&s), php_escape(json.clone()), "{s:?}");
                assert_eq!(
                    php_escape(json.clone()) == json,
                    special == "\"" || special.len() == 1 && special != "/",
                    "{s:?}"
                );
            }
        }
        assert_eq!(php_string(base), format!("\"{base}\""));
    }

    #[test]
    fn an_empty_object_is_written_as_an_empty_php_array() {
        assert_eq!(php_object([]), "[]");
        assert_eq!(
            php_object([("Content-Type", "application/json")]),
            r#"{"Content-Type":"application\/json"}"#
        );
    }
}
