//! The sign-up and sign-in form (one template, two modes).

use askama::Template;

use super::Nav;

#[derive(Template)]
#[template(path = "auth.html")]
pub struct AuthPage {
    pub nav: Nav,
    pub is_signup: bool,
    pub email: String,
    pub error: Option<String>,
    /// Where signing in returns to (a checked local path), or empty.
    pub next: String,
    /// Why the customer was sent here, when a page asked for an account.
    pub notice: Option<&'static str>,
}

impl AuthPage {
    /// The other form (sign up / sign in), keeping where to return to.
    pub fn other_form_href(&self) -> String {
        let page = if self.is_signup { "/login" } else { "/signup" };
        match serde_urlencoded::to_string([("next", self.next.as_str())]) {
            Ok(query) if !self.next.is_empty() => format!("{page}?{query}"),
            _ => page.into(),
        }
    }
}

/// What a new account reads after signing up.
#[derive(Template)]
#[template(path = "welcome.html")]
pub struct WelcomePage {
    pub nav: Nav,
    pub email: String,
    /// Where to continue: the page that asked for an account, or the sales.
    pub next: String,
    /// The account's address is not confirmed yet: the notice shows.
    pub unconfirmed: bool,
}
