//! Percent-encoding for URL path segments, query values and form bodies. Ids come
//! from annotations and configuration, so they are encoded rather than trusted not to
//! contain `/`, `?` or `..`.

use std::fmt::Write;

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Encodes one path segment or query value (RFC 3986 unreserved characters pass).
pub fn component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if unreserved(b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    // A segment of only dots would be read as a relative path step.
    if out == "." || out == ".." {
        return out.replace('.', "%2E");
    }
    out
}

/// `application/x-www-form-urlencoded` body from name/value pairs.
pub fn form(fields: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (i, (name, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        form_value(&mut out, name);
        out.push('=');
        form_value(&mut out, value);
    }
    out
}

fn form_value(out: &mut String, s: &str) {
    for &b in s.as_bytes() {
        if unreserved(b) || b == b'*' {
            out.push(b as char);
        } else if b == b' ' {
            out.push('+');
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_are_encoded() {
        assert_eq!(component("abc-DEF_1.2~"), "abc-DEF_1.2~");
        assert_eq!(component("a/b?c#d e"), "a%2Fb%3Fc%23d%20e");
        assert_eq!(component(".."), "%2E%2E");
        assert_eq!(component("é"), "%C3%A9");
    }

    #[test]
    fn form_encodes_spaces_as_plus() {
        assert_eq!(
            form(&[("response_type", "id_token token"), ("p", "a&b=c+d")]),
            "response_type=id_token+token&p=a%26b%3Dc%2Bd"
        );
    }
}
