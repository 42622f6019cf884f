//! Shared pieces every other module may use and that use nothing of this crate: the
//! engine settings, the wall clock type, the deadline trap, error chains, and the text
//! hygiene applied to anything a guest wrote before it reaches a log line or an error.

use std::future::Future;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

/// The wall clock the runtime uses for state TTLs, rate windows and (when granted) the
/// guest's `wasi:clocks/wall-clock`. Tests inject one to drive token expiry.
pub type WallClock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// Raised (as a trap) when the call's deadline passes, in a host import or by the epoch
/// callback; the call then fails with `CallError::Timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the call's deadline passed")]
pub(crate) struct DeadlineExceeded;

/// Runs host I/O, ending the call (a `DeadlineExceeded` trap) if the deadline passes first.
pub(crate) async fn until_deadline<F: Future>(
    deadline: Instant,
    io: F,
) -> wasmtime::Result<F::Output> {
    tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), io)
        .await
        .map_err(|_| wasmtime::Error::new(DeadlineExceeded))
}

/// The engine settings every cro engine shares. wasmtime is built without a garbage
/// collector (smaller, faster to build), so the proposals that need one are switched off;
/// providers compiled for wasm32-wasip2 use none of them.
pub(crate) fn base_config() -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config
        .wasm_component_model(true)
        .wasm_gc(false)
        .gc_support(false);
    config
}

pub(crate) fn error_chain(e: &wasmtime::Error) -> String {
    e.chain()
        .map(|c| bounded_display(c, CHAIN_PART_BYTES))
        .collect::<Vec<_>>()
        .join(": ")
}

/// Bytes of one error of a chain kept when it is formatted. A trap's backtrace names the
/// guest's functions, and a guest can make those names megabytes long: formatted whole,
/// each failing call cost hundreds of MiB and seconds after its deadline.
pub(crate) const CHAIN_PART_BYTES: usize = 2048;

/// `value` formatted, but no more than `max` bytes of it ever produced: formatting stops
/// there (the writer refuses the rest), so a huge `Display` costs what `max` allows.
pub(crate) fn bounded_display(value: &dyn std::fmt::Display, max: usize) -> String {
    struct Bounded {
        out: String,
        max: usize,
        cut: bool,
    }
    impl std::fmt::Write for Bounded {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let room = self.max.saturating_sub(self.out.len());
            if s.len() <= room {
                self.out.push_str(s);
                return Ok(());
            }
            self.out.push_str(clip(s, room));
            self.cut = true;
            Err(std::fmt::Error)
        }
    }
    let mut w = Bounded {
        out: String::new(),
        max,
        cut: false,
    };
    // An error here is the writer's own refusal: what was kept is the answer.
    let _ = std::fmt::write(&mut w, format_args!("{value}"));
    if w.cut {
        w.out.push_str("… [cut]");
    }
    w.out
}

/// A spec field with an unacceptable value (turned into a `GrantError` by `grants`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldError {
    pub(crate) field: String,
    pub(crate) reason: String,
}

impl FieldError {
    pub(crate) fn new(field: impl Into<String>, reason: impl Into<String>) -> FieldError {
        FieldError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// A DNS-1123 label: what namespaces and provider names are.
pub(crate) fn is_dns_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// A DNS-1123 subdomain: what most object names are.
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Characters of one guest string quoted in a denial or warning line.
pub(crate) const QUOTED_CHARS: usize = 128;

/// The first `max` bytes of `text` on a character boundary, or all of it.
pub(crate) fn clip(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A guest string made safe for one log line: control characters (newlines included)
/// escaped so the guest cannot forge a separate line or move the cursor, and at most
/// `max` bytes of the input kept.
pub fn escape_line(text: &str, max: usize) -> String {
    let kept = clip(text, max);
    let mut out = String::with_capacity(kept.len() + 16);
    for c in kept.chars() {
        if needs_escape(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if kept.len() < text.len() {
        out.push_str(&format!("… [{} more bytes cut]", text.len() - kept.len()));
    }
    out
}

/// Characters that would break a log line apart (or look like they do): control
/// characters, the Unicode line and paragraph separators, and the invisible format
/// characters that reorder or hide what a reader sees.
pub(crate) fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') || is_invisible_format(c)
}

/// Unicode format characters a terminal or log viewer does not show but obeys: the bidi
/// embeddings, overrides, isolates and marks (which make `evil.example` read as
/// something else), zero-width characters, word joiners, the soft hyphen, the BOM, the
/// deprecated shaping controls, interlinear annotations and tags (invisible ASCII).
pub fn is_invisible_format(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{061C}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}'
            | '\u{206A}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{E0000}'..='\u{E007F}'
    )
}

/// A guest string quoted inside a host message (a denial, an invalid name).
pub(crate) fn quote(text: &str) -> String {
    escape_line(text, QUOTED_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trap in a function whose name is a megabyte long formats in a few KiB: the
    /// backtrace is cut while it is written, not after.
    #[test]
    fn a_trap_backtrace_with_huge_names_is_cut_while_formatted() {
        let name = "f".repeat(1 << 20);
        let wat = format!(
            r#"(module (func ${name} (export "run") call ${name}2) (func ${name}2 unreachable))"#
        );
        let engine = wasmtime::Engine::default();
        let module = wasmtime::Module::new(&engine, &wat).unwrap();
        let mut store = wasmtime::Store::new(&engine, ());
        let instance = wasmtime::Instance::new(&mut store, &module, &[]).unwrap();
        let run = instance
            .get_typed_func::<(), ()>(&mut store, "run")
            .unwrap();
        let err = run.call(&mut store, ()).unwrap_err();
        let text = error_chain(&err);
        assert!(text.len() < 3 * CHAIN_PART_BYTES, "{} bytes", text.len());
        assert!(text.contains("unreachable"), "{text}");
        assert!(text.contains("… [cut]"), "{text}");
    }

    #[test]
    fn bounded_display_stops_at_its_bound() {
        assert_eq!(bounded_display(&"short", 10), "short");
        assert_eq!(bounded_display(&"héllo world", 3), "hé… [cut]");
    }

    #[test]
    fn clips_on_character_boundaries() {
        assert_eq!(clip("héllo", 2), "h");
        assert_eq!(clip("héllo", 3), "hé");
        assert_eq!(clip("héllo", 50), "héllo");
    }

    #[test]
    fn escapes_control_characters() {
        assert_eq!(
            escape_line("a\nb\r\tc\u{1b}[2J", 100),
            "a\\nb\\r\\tc\\u{1b}[2J"
        );
        assert_eq!(escape_line("x\u{2028}y", 100), "x\\u{2028}y");
        // Bidi overrides and zero-width characters would reorder or hide text.
        assert_eq!(
            escape_line("a\u{202e}b\u{200b}c\u{2066}d\u{feff}", 100),
            "a\\u{202e}b\\u{200b}c\\u{2066}d\\u{feff}"
        );
        let long = "z".repeat(1 << 20);
        let line = escape_line(&long, 10);
        assert!(line.starts_with("zzzzzzzzzz… ["), "{line}");
        assert!(line.len() < 60, "{line}");
        assert!(quote(&long).len() < QUOTED_CHARS + 40);
    }
}
