//! Reading the expiry of an access token. The signature is not checked: the token is
//! only forwarded to the fabric, which verifies it; `exp` only decides when to renew.

use base64::Engine;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

/// Identity managers differ on padding; accept it present or absent.
const LENIENT_URL_SAFE: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    #[error("access token has {0} dot-separated parts, not 3")]
    Parts(usize),
    #[error("access token payload is not base64url: {0}")]
    Base64(String),
    #[error("access token payload is not a JSON object: {0}")]
    Json(String),
    #[error("access token payload has no numeric 'exp'")]
    NoExp,
}

/// The `exp` claim (Unix seconds) of a JWT.
pub fn expiry(token: &str) -> Result<u64, JwtError> {
    let parts: Vec<&str> = token.trim().split('.').collect();
    if parts.len() != 3 {
        return Err(JwtError::Parts(parts.len()));
    }
    // Tolerate whitespace and the standard alphabet some encoders emit.
    let payload: String = parts[1]
        .chars()
        .filter(|c| !c.is_whitespace())
        .map(|c| match c {
            '+' => '-',
            '/' => '_',
            c => c,
        })
        .collect();
    let bytes = LENIENT_URL_SAFE
        .decode(payload.as_bytes())
        .map_err(|e| JwtError::Base64(e.to_string()))?;
    let claims: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| JwtError::Json(e.to_string()))?;
    let exp = claims
        .as_object()
        .ok_or_else(|| JwtError::Json("not an object".into()))?
        .get("exp")
        .ok_or(JwtError::NoExp)?;
    if let Some(n) = exp.as_u64() {
        return Ok(n);
    }
    match exp.as_f64() {
        Some(f) if f.is_finite() && f >= 0.0 => Ok(f as u64),
        _ => Err(JwtError::NoExp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE, URL_SAFE_NO_PAD};

    fn token_with(engine: &impl Engine, payload: &str) -> String {
        format!(
            "{}.{}.sig",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256"}"#),
            engine.encode(payload)
        )
    }

    #[test]
    fn reads_exp_without_padding() {
        // 10 bytes of JSON need padding, so the unpadded form is really exercised.
        let t = token_with(&URL_SAFE_NO_PAD, r#"{"exp":17}"#);
        assert!(!t.contains('='));
        assert_eq!(expiry(&t).unwrap(), 17);
    }

    #[test]
    fn reads_exp_with_padding_and_trailing_whitespace() {
        let t = token_with(&URL_SAFE, r#"{"exp":1700000000}"#) + " \n";
        assert_eq!(expiry(&t).unwrap(), 1_700_000_000);
        let t = format!(
            "h.{} \n.s",
            URL_SAFE_NO_PAD.encode(r#"{"sub":"x","exp":5}"#)
        );
        assert_eq!(expiry(&t).unwrap(), 5);
    }

    #[test]
    fn reads_standard_alphabet_and_float_exp() {
        let t = token_with(&STANDARD, r#"{"exp":12.9,"n":"??>>"}"#);
        assert_eq!(expiry(&t).unwrap(), 12);
    }

    #[test]
    fn rejects_bad_tokens() {
        assert_eq!(expiry("a.b"), Err(JwtError::Parts(2)));
        assert_eq!(expiry("a.b.c.d"), Err(JwtError::Parts(4)));
        assert_eq!(expiry(""), Err(JwtError::Parts(1)));
        assert!(matches!(expiry("a.!!!.c"), Err(JwtError::Base64(_))));
        assert!(matches!(
            expiry(&token_with(&URL_SAFE_NO_PAD, "[1]")),
            Err(JwtError::Json(_))
        ));
        assert!(matches!(
            expiry(&token_with(&URL_SAFE_NO_PAD, "nope")),
            Err(JwtError::Json(_))
        ));
        assert_eq!(
            expiry(&token_with(&URL_SAFE_NO_PAD, r#"{"iat":1}"#)),
            Err(JwtError::NoExp)
        );
        assert_eq!(
            expiry(&token_with(&URL_SAFE_NO_PAD, r#"{"exp":"soon"}"#)),
            Err(JwtError::NoExp)
        );
        assert_eq!(
            expiry(&token_with(&URL_SAFE_NO_PAD, r#"{"exp":-3}"#)),
            Err(JwtError::NoExp)
        );
    }
}
