//! JSON text as PHP's `json_encode` writes it (its default flags): `/` as `\/` and every
//! character beyond ASCII as `\uXXXX` (a UTF-16 surrogate pair beyond the BMP).

/// Rewrites valid JSON text with PHP's escapes: serde_json's output, or text PHP wrote (kept
/// as read), which holds `\/` already. Outside strings, valid JSON holds neither `/` nor
/// non-ASCII characters, so each character is rewritten where it stands; the character after a
/// backslash is an escape and stays as it is.
pub(crate) fn php_escape(json: &str) -> String {
    if json.bytes().all(|b| b.is_ascii() && b != b'/') {
        return json.to_owned();
    }
    let mut out = String::with_capacity(json.len() + json.len() / 8);
    let mut escaped = false;
    for c in json.chars() {
        match c {
            _ if escaped => {
                out.push(c);
                escaped = false;
            }
            '\\' => {
                out.push(c);
                escaped = true;
            }
            '/' => out.push_str("\\/"),
            c if c.is_ascii() => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out
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
    fn unit(out: &mut String, u: u16) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        out.push_str("\\u");
        for shift in [12, 8, 4, 0] {
            out.push(char::from(HEX[usize::from((u >> shift) & 0xf)]));
        }
    }
    out.push('"');
    let mut plain = 0;
    for (i, c) in s.char_indices() {
        let escape = match c {
            '"' => "\\\"",
            '\\' => "\\\\",
            '/' => "\\/",
            '\u{8}' => "\\b",
            '\u{c}' => "\\f",
            '\n' => "\\n",
            '\r' => "\\r",
            '\t' => "\\t",
            c if c < ' ' || !c.is_ascii() => "",
            _ => continue,
        };
        out.push_str(&s[plain..i]);
        plain = i + c.len_utf8();
        if escape.is_empty() {
            let mut units = [0u16; 2];
            for &u in c.encode_utf16(&mut units).iter() {
                unit(out, u);
            }
        } else {
            out.push_str(escape);
        }
    }
    out.push_str(&s[plain..]);
    out.push('"');
}

/// A JSON object of string values in this order, as `json_encode` writes a PHP array of strings
/// (`[]` when empty, as PHP writes an empty array).
pub(crate) fn php_object<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::with_capacity(128);
    out.push('{');
    for (key, value) in pairs {
        if out.len() > 1 {
            out.push(',');
        }
        push_php_string(&mut out, key);
        out.push(':');
        push_php_string(&mut out, value);
    }
    if out.len() == 1 {
        return "[]".to_owned();
    }
    out.push('}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slashes_and_non_ascii_are_escaped_as_php_does() {
        assert_eq!(
            php_escape(r#"{"a":"Grüße/€ 😀"}"#),
            r#"{"a":"Gr\u00fc\u00dfe\/\u20ac \ud83d\ude00"}"#
        );
        assert_eq!(php_escape(r#"{"n":1.5}"#), r#"{"n":1.5}"#);
    }

    #[test]
    fn text_php_already_escaped_is_kept() {
        assert_eq!(php_escape(r#"{"a":"x\/y\\/z"}"#), r#"{"a":"x\/y\\\/z"}"#);
    }

    #[test]
    fn a_string_is_escaped_as_serde_json_then_php_do() {
        for s in [
            "plain",
            "",
            "q\"b\\s/\u{8}\u{c}\n\r\t\u{1}\u{1f}\u{7f}",
            "Grüße/€ 😀 end",
            "\u{7f}\u{80}\u{ffff}\u{10000}",
        ] {
            assert_eq!(
                php_string(s),
                php_escape(&serde_json::Value::from(s).to_string()),
                "{s:?}"
            );
        }
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
