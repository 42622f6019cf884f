//! Cutting text from outside (command output, provider errors) to a size an API field
//! or an event can hold, without splitting a UTF-8 character.

/// The first `max` characters of `text`, or all of it.
pub fn clip(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((end, _)) => &text[..end],
        None => text,
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
}
