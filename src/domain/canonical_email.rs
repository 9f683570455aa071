//! One person, one address: the form of an email under which addresses
//! that reach the same mailbox compare equal, so a `+tag` or a dot cannot
//! make a second person out of one for places and limits.

use super::Email;

/// Providers whose mailboxes ignore dots in the local part, each with the
/// domain it is known by (Google's two names reach one mailbox).
pub const DOT_BLIND_PROVIDERS: &[(&str, &str)] =
    &[("gmail.com", "gmail.com"), ("googlemail.com", "gmail.com")];

/// The address lower-cased, without the `+tag` of its local part, and for
/// the providers in `DOT_BLIND_PROVIDERS` without its dots and under the
/// provider's one domain.
pub fn canonical_email(email: &Email) -> String {
    canonical_address(email.as_str())
}

/// As `canonical_email`, for an address read back from storage.
pub fn canonical_address(address: &str) -> String {
    let address = address.trim().to_lowercase();
    let Some((local, domain)) = address.rsplit_once('@') else {
        return address;
    };
    let mut local = match local.split_once('+') {
        Some((before_tag, _)) => before_tag.to_string(),
        None => local.to_string(),
    };
    let mut domain = domain.to_string();
    if let Some((_, known_as)) = DOT_BLIND_PROVIDERS
        .iter()
        .find(|(provider, _)| *provider == domain)
    {
        local.retain(|c| c != '.');
        domain = (*known_as).to_string();
    }
    format!("{local}@{domain}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(raw: &str) -> String {
        canonical_email(&Email::parse(raw).unwrap())
    }

    #[test]
    fn lower_cases_every_address() {
        assert_eq!(canonical("Ada@Example.COM"), "ada@example.com");
    }

    #[test]
    fn drops_the_tag_for_every_provider() {
        assert_eq!(canonical("ada+sale@example.com"), "ada@example.com");
        assert_eq!(canonical("ada+a+b@example.com"), "ada@example.com");
        assert_eq!(canonical("ada+@gmail.com"), "ada@gmail.com");
    }

    #[test]
    fn keeps_dots_where_the_provider_reads_them() {
        assert_eq!(canonical("a.da@example.com"), "a.da@example.com");
        assert_eq!(canonical("a.da@mail.gmail.com"), "a.da@mail.gmail.com");
    }

    #[test]
    fn drops_dots_at_gmail_and_names_googlemail_gmail() {
        assert_eq!(canonical("A.Da.L+x@gmail.com"), "adal@gmail.com");
        assert_eq!(canonical("a.da@googlemail.com"), "ada@gmail.com");
        assert_eq!(canonical("ada@GoogleMail.com"), "ada@gmail.com");
    }

    #[test]
    fn dots_after_the_tag_do_not_matter() {
        assert_eq!(canonical("ada+a.b@gmail.com"), "ada@gmail.com");
        assert_eq!(canonical("ada+a.b@example.com"), "ada@example.com");
    }
}
