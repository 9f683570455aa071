use super::InvalidInput;

/// A sign-in address, normalised to lower case so one person has one account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Email(String);

impl Email {
    pub fn parse(raw: &str) -> Result<Email, InvalidInput> {
        let email = raw.trim().to_lowercase();
        let valid_shape = match email.split_once('@') {
            Some((local, domain)) => {
                !local.is_empty()
                    && domain.contains('.')
                    && !domain.starts_with('.')
                    && !domain.ends_with('.')
            }
            None => false,
        };
        if !valid_shape
            || email.len() > 254
            || email.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(InvalidInput::NotAnEmail);
        }
        Ok(Email(email))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A password as typed; only its argon2 hash is ever stored.
pub struct Password(String);

impl Password {
    pub const MIN_LEN: usize = 8;
    pub const MAX_LEN: usize = 256;

    pub fn parse(raw: &str) -> Result<Password, InvalidInput> {
        let length = raw.chars().count();
        if length < Self::MIN_LEN {
            return Err(InvalidInput::PasswordTooShort { min: Self::MIN_LEN });
        }
        if length > Self::MAX_LEN {
            return Err(InvalidInput::PasswordTooLong { max: Self::MAX_LEN });
        }
        Ok(Password(raw.to_owned()))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Password(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn email_is_normalised_and_checked() {
        assert_eq!(
            Email::parse(" Ann@Example.COM ").unwrap().as_str(),
            "ann@example.com"
        );
        for bad in [
            "",
            "ann",
            "ann@",
            "@example.com",
            "ann@example",
            "a b@example.com",
            "ann@.com",
        ] {
            assert!(Email::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn password_length_is_bounded() {
        assert!(Password::parse("short").is_err());
        assert!(Password::parse("long enough").is_ok());
        assert!(Password::parse(&"x".repeat(300)).is_err());
        assert_eq!(
            format!("{:?}", Password::parse("secret-pass").unwrap()),
            "Password(<redacted>)"
        );
    }
}
