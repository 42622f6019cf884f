//! Cutting text from outside (command output, provider errors) to a size an API field
//! or an event can hold, without splitting a UTF-8 character.

/// The first `max` characters of `text`, or all of it.
pub(crate) fn clip(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

/// A Kubernetes client error in words. kube's own text of an API error repeats the
/// whole response as a Rust `Debug` dump; people reading logs and `status.error` need
/// the API server's message, the HTTP code and the reason.
pub(crate) fn kube_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => {
            let mut text = if status.message.is_empty() {
                "the API server refused the request".to_owned()
            } else {
                status.message.clone()
            };
            if status.code != 0 {
                text.push_str(&format!(" (HTTP {}", status.code));
                if !status.reason.is_empty() {
                    text.push_str(&format!(", {}", status.reason));
                }
                text.push(')');
            }
            text
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clips_on_character_boundaries() {
        assert_eq!(clip("héllo", 2), "hé");
        assert_eq!(clip("héllo", 5), "héllo");
        assert_eq!(clip("héllo", 50), "héllo");
        assert_eq!(clip("", 3), "");
    }

    #[test]
    fn api_errors_read_as_words_not_dumps() {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "message": "namespaces \"cro\" not found",
            "reason": "NotFound", "code": 404
        }))
        .unwrap();
        let text = kube_error(&kube::Error::Api(Box::new(status)));
        assert_eq!(text, "namespaces \"cro\" not found (HTTP 404, NotFound)");
    }
}
