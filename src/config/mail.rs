//! `SMTP_URL`: where the customer's mail goes out.

use anyhow::{bail, Context};

/// An SMTP server the mail job hands messages to.
#[derive(Clone, PartialEq, Eq)]
pub struct SmtpServer {
    pub host: String,
    pub port: u16,
    /// User and password, when the URL carries them.
    pub credentials: Option<(String, String)>,
}

impl std::fmt::Debug for SmtpServer {
    // The password stays out of logs and panics.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmtpServer")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.credentials.as_ref().map(|(user, _)| user))
            .finish()
    }
}

impl SmtpServer {
    /// `smtp://[user:password@]host[:port]` (port 25 by default). The
    /// connection is plain SMTP: a relay on the same machine or network
    /// (Postfix, a provider's local agent) carries mail further with TLS.
    pub fn parse(url: &str) -> anyhow::Result<SmtpServer> {
        // The URL may carry a password: errors name the host part only.
        let shown = url.rsplit_once('@').map_or(url, |(_, host)| host);
        let Some(rest) = url.trim().strip_prefix("smtp://") else {
            bail!("SMTP_URL (…{shown:?}): use smtp://host:port (plain SMTP to a relay)");
        };
        let rest = rest.trim_end_matches('/');
        let (credentials, address) = match rest.rsplit_once('@') {
            Some((user_info, address)) => {
                let (user, password) = user_info.split_once(':').unwrap_or((user_info, ""));
                (Some((user.to_string(), password.to_string())), address)
            }
            None => (None, rest),
        };
        let (host, port) = match address.rsplit_once(':') {
            Some((host, port)) => (
                host,
                port.parse()
                    .with_context(|| format!("SMTP_URL: {port:?} is not a port"))?,
            ),
            None => (address, 25),
        };
        if host.is_empty() {
            bail!("SMTP_URL (…{shown:?}) names no host");
        }
        Ok(SmtpServer {
            host: host.to_string(),
            port,
            credentials,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_host_port_and_credentials() {
        let server = SmtpServer::parse("smtp://127.0.0.1:2525").unwrap();
        assert_eq!((server.host.as_str(), server.port), ("127.0.0.1", 2525));
        assert_eq!(server.credentials, None);
        let server = SmtpServer::parse("smtp://shop:secret@mail.example.com").unwrap();
        assert_eq!(
            (server.host.as_str(), server.port),
            ("mail.example.com", 25)
        );
        assert_eq!(server.credentials, Some(("shop".into(), "secret".into())));
        assert!(!format!("{server:?}").contains("secret"));
    }

    #[test]
    fn refuses_what_it_cannot_use() {
        assert!(SmtpServer::parse("smtps://mail.example.com:465").is_err());
        assert!(SmtpServer::parse("smtp://:25").is_err());
        assert!(SmtpServer::parse("smtp://host:port").is_err());
    }
}
