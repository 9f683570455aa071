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
}
