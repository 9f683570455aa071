//! A client of the shop's pages as a browser is one: a cookie jar for its
//! session, CSRF tokens taken from the forms the shop hands out, and the
//! shop's 303 answers left to the caller.

use std::sync::OnceLock;

use anyhow::{anyhow, bail};
use reqwest::redirect::Policy;
use reqwest::{Response, StatusCode};

/// The CSRF token of the first form in a page.
pub fn csrf_token(html: &str) -> Option<String> {
    static FIELD: OnceLock<regex::Regex> = OnceLock::new();
    FIELD
        .get_or_init(|| regex::Regex::new(r#"name="csrf_token" value="([^"]+)""#).unwrap())
        .captures(html)
        .map(|c| c[1].to_string())
}

/// Solves `challenge` on the blocking pool (it is CPU work, as in a
/// browser's worker): the base64 JSON the widget puts in the form.
pub async fn solve(challenge: altcha::Challenge) -> anyhow::Result<String> {
    use base64::Engine;
    tokio::task::spawn_blocking(move || {
        let solution = altcha::solve_challenge(altcha::SolveChallengeOptions::new(&challenge))?
            .ok_or_else(|| anyhow!("the bot check was not solved in time"))?;
        let payload = serde_json::to_vec(&altcha::Payload {
            challenge,
            solution,
        })?;
        Ok(base64::engine::general_purpose::STANDARD.encode(payload))
    })
    .await?
}

/// One session with the shop; clones share its cookies and connections.
#[derive(Clone)]
pub struct Browser {
    pub client: reqwest::Client,
    pub base: String,
}

impl Browser {
    /// What any browser of the shop needs; callers add their own timeouts
    /// and pool limits. Redirects are not followed: a successful form
    /// answers 303, and where it points is the answer.
    pub fn client_builder() -> reqwest::ClientBuilder {
        reqwest::Client::builder()
            .cookie_store(true)
            .redirect(Policy::none())
    }

    pub fn new(base: &str, client: reqwest::Client) -> Browser {
        Browser {
            client,
            base: base.trim_end_matches('/').to_string(),
        }
    }

    pub async fn get(&self, path: &str) -> reqwest::Result<Response> {
        self.client.get(format!("{}{path}", self.base)).send().await
    }

    pub async fn post(&self, path: &str, fields: &[(&str, &str)]) -> reqwest::Result<Response> {
        self.client
            .post(format!("{}{path}", self.base))
            .form(fields)
            .send()
            .await
    }

    /// A CSRF token as a page of the shop would hand it out to this session.
    pub async fn csrf(&self) -> anyhow::Result<String> {
        let response = self.get("/login").await?;
        let status = response.status();
        let page = response.text().await?;
        match csrf_token(&page) {
            Some(token) if status == StatusCode::OK => Ok(token),
            _ => Err(anyhow!(
                "GET /login answered {status} without a csrf_token:\n{page}"
            )),
        }
    }

    /// Posts a form with this session's CSRF token added.
    pub async fn post_form(&self, path: &str, fields: &[(&str, &str)]) -> anyhow::Result<Response> {
        let token = self.csrf().await?;
        let mut fields = fields.to_vec();
        fields.push(("csrf_token", &token));
        Ok(self.post(path, &fields).await?)
    }

    /// Creates the account, through the door's bot check as the sign-up
    /// page's widget passes it; the shop signs it in, in a new session.
    pub async fn sign_up(&self, email: &str, password: &str) -> anyhow::Result<Response> {
        self.post_sign_up(&[("email", email), ("password", password)])
            .await
    }

    /// The sign-up form with `fields`, its bot check solved.
    pub async fn post_sign_up(&self, fields: &[(&str, &str)]) -> anyhow::Result<Response> {
        let solved = self.solve_bot_check(None).await?;
        let mut fields = fields.to_vec();
        fields.push(("altcha", &solved));
        self.post_form("/signup", &fields).await
    }

    /// Joins `product`'s waiting room as its join form does, bot check
    /// solved. The answer is left to the caller (a 303 to the waiting page).
    pub async fn join_waiting_room(&self, product: i64) -> anyhow::Result<Response> {
        // No challenge for a sale without a waiting room: the join is sent
        // without one, and the shop's answer says why.
        let solved = self
            .solve_bot_check(Some(product))
            .await
            .unwrap_or_default();
        self.post_form(
            &format!("/products/{product}/queue"),
            &[("altcha", &solved)],
        )
        .await
    }

    /// Fetches a challenge for the door of sign-up (`None`) or of a sale's
    /// waiting room and solves it as the ALTCHA widget does: the form
    /// field's value.
    pub async fn solve_bot_check(&self, sale: Option<i64>) -> anyhow::Result<String> {
        let path = match sale {
            Some(sale) => format!("/door/challenge?sale={sale}"),
            None => "/door/challenge".into(),
        };
        let response = self.get(&path).await?;
        let status = response.status();
        if status != StatusCode::OK {
            bail!("GET {path} answered {status}");
        }
        let challenge: altcha::Challenge = serde_json::from_str(&response.text().await?)?;
        solve(challenge).await
    }

    pub async fn sign_in(&self, email: &str, password: &str) -> anyhow::Result<()> {
        let response = self
            .post_form("/login", &[("email", email), ("password", password)])
            .await?;
        if response.status() != StatusCode::SEE_OTHER {
            bail!("sign-in of {email} answered {}", response.status());
        }
        Ok(())
    }

    /// The buy button, with a form token the caller fetched beforehand (so a
    /// burst of buys measures the buys alone).
    pub async fn buy(
        &self,
        product: i64,
        quantity: &str,
        token: &str,
        idempotency_key: Option<&str>,
    ) -> reqwest::Result<Response> {
        let mut fields = vec![("quantity", quantity), ("csrf_token", token)];
        fields.extend(idempotency_key.map(|key| ("idempotency_key", key)));
        self.post(&format!("/products/{product}/buy"), &fields)
            .await
    }

    pub async fn pay(&self, order: i64, card: &str) -> anyhow::Result<Response> {
        self.post_form(&format!("/orders/{order}/pay"), &[("card_number", card)])
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csrf_token_is_read_from_the_form() {
        assert_eq!(
            csrf_token(r#"<input type="hidden" name="csrf_token" value="abc123">"#).as_deref(),
            Some("abc123")
        );
        assert_eq!(csrf_token("<p>no form</p>"), None);
    }
}
