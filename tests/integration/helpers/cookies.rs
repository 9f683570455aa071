//! Session cookies as someone copying them would use them: read out of a
//! browser's jar and replayed by hand, on this instance or another.

use std::sync::Arc;

use reqwest::cookie::{CookieStore, Jar};
use reqwest::redirect::Policy;

use super::{Browser, TestApp};

/// A browser whose cookies the test can read.
pub fn browser_with_jar(app: &TestApp) -> (Browser, Arc<Jar>) {
    let jar = Arc::new(Jar::default());
    let client = reqwest::Client::builder()
        .cookie_provider(jar.clone())
        .redirect(Policy::none())
        .build()
        .unwrap();
    (Browser::with_client(&app.address, client), jar)
}

/// The `Cookie` header the jar would send to `app`.
pub fn cookie_header(jar: &Jar, app: &TestApp) -> String {
    jar.cookies(&app.address.parse().unwrap())
        .expect("the shop set a cookie")
        .to_str()
        .unwrap()
        .to_string()
}

/// A request carrying exactly `cookie`: a replayed copy.
pub async fn get_with_cookie(app: &TestApp, path: &str, cookie: &str) -> reqwest::Response {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .unwrap()
        .get(format!("{}{path}", app.address))
        .header("Cookie", cookie)
        .send()
        .await
        .unwrap()
}
