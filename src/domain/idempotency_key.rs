use super::InvalidInput;

/// The client's name for one intended action (one click on Buy, Pay or Refund).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub const MAX_LEN: usize = 255;

    pub fn parse(raw: &str) -> Result<IdempotencyKey, InvalidInput> {
        if raw.is_empty() {
            return Err(InvalidInput::KeyEmpty);
        }
        if raw.len() > Self::MAX_LEN {
            return Err(InvalidInput::KeyTooLong { max: Self::MAX_LEN });
        }
        if raw.chars().any(|c| c.is_control()) {
            return Err(InvalidInput::KeyControlCharacters);
        }
        Ok(IdempotencyKey(raw.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_bounded() {
        assert!(IdempotencyKey::parse("a").is_ok());
        assert!(IdempotencyKey::parse(&"k".repeat(255)).is_ok());
        assert!(IdempotencyKey::parse("").is_err());
        assert!(IdempotencyKey::parse(&"k".repeat(256)).is_err());
        assert!(IdempotencyKey::parse("a\0b").is_err());
    }
}
