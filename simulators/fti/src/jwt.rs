//! HS256 JSON Web Tokens, as the identity manager issues them: three base64url parts
//! without padding, the payload carrying `exp`, `iat` and `sub`.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;
use serde_json::{Value, json};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JwtError {
    #[error("token is not three dot-separated parts")]
    Shape,
    #[error("token part is not base64url: {0}")]
    Encoding(String),
    #[error("token signature does not verify")]
    Signature,
    #[error("token payload is not a JSON object with a numeric exp")]
    Payload,
}

/// Claims the simulator puts in (and checks on) its tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub sub: String,
    pub iat: i64,
    pub exp: i64,
    pub jti: String,
    pub iss: String,
    pub azp: String,
    pub typ: String,
}

pub struct Signer {
    key: hmac::Key,
}

impl Signer {
    pub fn new(secret: &[u8]) -> Self {
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
        }
    }

    pub fn sign(&self, claims: &Claims) -> String {
        let header = json!({"alg": "HS256", "typ": "JWT"});
        let payload = json!({
            "exp": claims.exp,
            "iat": claims.iat,
            "sub": claims.sub,
            "jti": claims.jti,
            "iss": claims.iss,
            "azp": claims.azp,
            "typ": claims.typ,
            "scope": "openid profile email",
        });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(payload.to_string())
        );
        let tag = hmac::sign(&self.key, signing_input.as_bytes());
        format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
    }

    /// Checks shape and signature and returns the claims; expiry is the caller's call
    /// because it depends on the injected clock.
    pub fn verify(&self, token: &str) -> Result<Claims, JwtError> {
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(JwtError::Shape);
        };
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|e| JwtError::Encoding(e.to_string()))?;
        let signing_input = &token[..header.len() + 1 + payload.len()];
        hmac::verify(&self.key, signing_input.as_bytes(), &signature)
            .map_err(|_| JwtError::Signature)?;
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|e| JwtError::Encoding(e.to_string()))?;
        let payload: Value = serde_json::from_slice(&payload).map_err(|_| JwtError::Payload)?;
        let text = |k: &str| {
            payload
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        Ok(Claims {
            sub: text("sub"),
            iat: payload
                .get("iat")
                .and_then(Value::as_i64)
                .unwrap_or_default(),
            exp: payload
                .get("exp")
                .and_then(Value::as_i64)
                .ok_or(JwtError::Payload)?,
            jti: text("jti"),
            iss: text("iss"),
            azp: text("azp"),
            typ: text("typ"),
        })
    }
}

/// Decodes a token's payload without checking its signature (for tests and tools).
pub fn decode_payload(token: &str) -> Result<Value, JwtError> {
    let parts: Vec<&str> = token.split('.').collect();
    let [_, payload, _] = parts.as_slice() else {
        return Err(JwtError::Shape);
    };
    let bytes = URL_SAFE_NO_PAD
        .decode(payload)
        .map_err(|e| JwtError::Encoding(e.to_string()))?;
    serde_json::from_slice(&bytes).map_err(|_| JwtError::Payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> Claims {
        Claims {
            sub: "user".into(),
            iat: 1_700_000_000,
            exp: 1_700_000_300,
            jti: "j1".into(),
            iss: "iss".into(),
            azp: "client".into(),
            typ: "Bearer".into(),
        }
    }

    #[test]
    fn round_trip_and_tamper() {
        let signer = Signer::new(b"secret");
        let token = signer.sign(&claims());
        assert!(!token.contains('='));
        assert_eq!(signer.verify(&token), Ok(claims()));
        assert_eq!(decode_payload(&token).unwrap()["exp"], 1_700_000_300);

        let other = Signer::new(b"other");
        assert_eq!(other.verify(&token), Err(JwtError::Signature));

        let mut parts: Vec<String> = token.split('.').map(String::from).collect();
        parts[1] = URL_SAFE_NO_PAD.encode(r#"{"exp":9999999999,"sub":"user"}"#);
        assert_eq!(signer.verify(&parts.join(".")), Err(JwtError::Signature));
        assert_eq!(signer.verify("a.b"), Err(JwtError::Shape));
        assert_eq!(signer.verify("a.b.c.d"), Err(JwtError::Shape));
    }
}
