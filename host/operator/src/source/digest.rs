//! Size-limited, hashing accumulation of a component's bytes, shared by every source.

use sha2::{Digest, Sha256};

use super::error::SourceError;

/// Lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Whether `s` is a sha256 as the CRD writes it: 64 lowercase hex digits.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Collects streamed chunks, refusing as soon as the total passes `limit` (so a lying or
/// endless origin costs at most `limit` bytes of memory), and hashes them on the way.
pub struct Accumulator {
    origin: String,
    limit: u64,
    bytes: Vec<u8>,
    hasher: Sha256,
}

impl Accumulator {
    pub fn new(origin: impl Into<String>, limit: u64) -> Accumulator {
        Accumulator {
            origin: origin.into(),
            limit,
            bytes: Vec::new(),
            hasher: Sha256::new(),
        }
    }

    pub fn push(&mut self, chunk: &[u8]) -> Result<(), SourceError> {
        let size = self.bytes.len() as u64 + chunk.len() as u64;
        if size > self.limit {
            return Err(SourceError::TooLarge {
                origin: self.origin.clone(),
                size,
                limit: self.limit,
                declared: false,
            });
        }
        self.hasher.update(chunk);
        self.bytes.extend_from_slice(chunk);
        Ok(())
    }

    /// The bytes, if their sha256 is `expected_hex`.
    pub fn finish(self, expected_hex: &str) -> Result<Vec<u8>, SourceError> {
        let actual = hex(&self.hasher.finalize());
        if actual != expected_hex {
            return Err(SourceError::DigestMismatch {
                origin: self.origin,
                expected: expected_hex.to_owned(),
                actual,
            });
        }
        Ok(self.bytes)
    }
}

/// Refuses before downloading when the origin announces more than `limit` bytes.
pub fn check_declared(origin: &str, declared: Option<u64>, limit: u64) -> Result<(), SourceError> {
    match declared {
        Some(size) if size > limit => Err(SourceError::TooLarge {
            origin: origin.to_owned(),
            size,
            limit,
            declared: true,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn sha256_of_nothing_is_the_known_value() {
        assert_eq!(sha256_hex(b""), EMPTY);
        assert!(is_sha256_hex(EMPTY));
        assert!(!is_sha256_hex(&EMPTY.to_uppercase()));
        assert!(!is_sha256_hex("abc"));
    }

    #[test]
    fn the_accumulator_verifies_and_names_both_digests_on_mismatch() {
        let mut a = Accumulator::new("https://x/c.wasm", 10);
        a.push(b"hello").unwrap();
        assert_eq!(a.finish(&sha256_hex(b"hello")).unwrap(), b"hello");

        let mut a = Accumulator::new("https://x/c.wasm", 10);
        a.push(b"hello").unwrap();
        let msg = a.finish(EMPTY).unwrap_err().to_string();
        assert!(
            msg.contains(EMPTY) && msg.contains(&sha256_hex(b"hello")),
            "{msg}"
        );
        assert!(msg.contains("https://x/c.wasm"), "{msg}");
    }

    #[test]
    fn the_accumulator_stops_at_the_limit_while_streaming() {
        let mut a = Accumulator::new("o", 8);
        a.push(b"12345").unwrap();
        a.push(b"678").unwrap();
        let err = a.push(b"9").unwrap_err();
        assert!(
            matches!(
                err,
                SourceError::TooLarge {
                    size: 9,
                    limit: 8,
                    declared: false,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn a_declared_size_over_the_limit_is_refused_up_front() {
        assert!(check_declared("o", Some(8), 8).is_ok());
        assert!(check_declared("o", None, 8).is_ok());
        let msg = check_declared("o", Some(9), 8).unwrap_err().to_string();
        assert!(
            msg.contains("9 bytes (as declared)") && msg.contains("limit of 8"),
            "{msg}"
        );
    }
}
