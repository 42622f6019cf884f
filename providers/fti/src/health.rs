//! The fabric's operational status of a device (`res_op_status`): its first character
//! is 0 OK, 1 warning, 2 critical; anything else, including an empty or missing status,
//! is not understood.

use crate::model::ProviderError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpStatus {
    Ok,
    Warning,
    Critical,
}

pub fn parse(status: Option<&str>, device: &str) -> Result<OpStatus, ProviderError> {
    match status.and_then(|s| s.chars().next()) {
        Some('0') => Ok(OpStatus::Ok),
        Some('1') => Ok(OpStatus::Warning),
        Some('2') => Ok(OpStatus::Critical),
        _ => Err(ProviderError::malformed(format!(
            "device {device} has unknown res_op_status '{}'",
            status.unwrap_or("<missing>")
        ))),
    }
}

/// The outcome of a health check.
pub fn check(status: Option<&str>, device: &str) -> Result<(), ProviderError> {
    match parse(status, device)? {
        OpStatus::Ok => Ok(()),
        OpStatus::Warning => Err(ProviderError::Warning(format!(
            "device {device} reports a warning (res_op_status '{}')",
            status.unwrap_or_default()
        ))),
        OpStatus::Critical => Err(ProviderError::Critical(format!(
            "device {device} reports a critical state (res_op_status '{}')",
            status.unwrap_or_default()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_character_decides() {
        assert_eq!(parse(Some("0"), "d"), Ok(OpStatus::Ok));
        assert_eq!(parse(Some("0x12"), "d"), Ok(OpStatus::Ok));
        assert_eq!(parse(Some("1"), "d"), Ok(OpStatus::Warning));
        assert_eq!(parse(Some("2 fan"), "d"), Ok(OpStatus::Critical));
        for bad in [Some(""), Some("3"), Some(" 0"), Some("é"), None] {
            assert!(matches!(
                parse(bad, "d"),
                Err(ProviderError::MalformedReply(_))
            ));
        }
    }

    #[test]
    fn check_maps_to_typed_errors() {
        assert_eq!(check(Some("0"), "d"), Ok(()));
        assert!(matches!(
            check(Some("1"), "d"),
            Err(ProviderError::Warning(_))
        ));
        assert!(matches!(
            check(Some("2"), "d"),
            Err(ProviderError::Critical(_))
        ));
        assert!(matches!(
            check(Some(""), "d"),
            Err(ProviderError::MalformedReply(_))
        ));
    }
}
