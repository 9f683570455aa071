//! The stylesheet, the page script and the bot check's widget, compiled into the binary and served
//! under addresses that carry a hash of their content
//! (`/static/app.<hash>.css`): a browser or CDN may keep them for a year
//! (`immutable`), since a changed file has a new address. The plain
//! addresses still answer, briefly cached, for pages rendered before.

use std::sync::LazyLock;

use actix_web::{get, http::header, web, HttpResponse};
use sha2::{Digest, Sha256};

use crate::error::AppError;

const STYLESHEET: &str = include_str!("../../templates/static/app.css");
const SCRIPT: &str = include_str!("../../templates/static/app.js");
// The ALTCHA widget for the door's bot check, from its npm package
// (`scripts/vendor-altcha`), served from here so no page calls out.
const BOT_CHECK_SCRIPT: &str = include_str!("../../templates/static/vendor/altcha/altcha.js");
const BOT_CHECK_STYLESHEET: &str = include_str!("../../templates/static/vendor/altcha/altcha.css");
const BOT_CHECK_WORKER: &str = include_str!("../../templates/static/vendor/altcha/pbkdf2.js");

/// A year: the longest `max-age` caches honour.
const FOREVER: &str = "public, max-age=31536000, immutable";
/// The unversioned addresses may change under the same name.
const BRIEFLY: &str = "public, max-age=300";
/// Another build's hash: this build's file, for this browser only and only
/// for a minute, so no shared cache keeps it under the other build's name.
const BRIEFLY_NO_STORE: &str = "private, max-age=60";

/// One static file and its content-hashed address.
struct Asset {
    url: String,
    body: &'static str,
    content_type: &'static str,
}

impl Asset {
    fn new(stem: &str, extension: &str, body: &'static str, content_type: &'static str) -> Asset {
        let hash = hex::encode(&Sha256::digest(body.as_bytes())[..8]);
        Asset {
            url: format!("/static/{stem}.{hash}.{extension}"),
            body,
            content_type,
        }
    }

    fn response(&self, cache_control: &'static str) -> HttpResponse {
        HttpResponse::Ok()
            .content_type(self.content_type)
            .insert_header((header::CACHE_CONTROL, cache_control))
            .body(self.body)
    }
}

static CSS: LazyLock<Asset> =
    LazyLock::new(|| Asset::new("app", "css", STYLESHEET, "text/css; charset=utf-8"));
static JS: LazyLock<Asset> =
    LazyLock::new(|| Asset::new("app", "js", SCRIPT, "text/javascript; charset=utf-8"));
static BOT_CHECK_JS: LazyLock<Asset> = LazyLock::new(|| {
    Asset::new(
        "altcha",
        "js",
        BOT_CHECK_SCRIPT,
        "text/javascript; charset=utf-8",
    )
});
static BOT_CHECK_CSS: LazyLock<Asset> = LazyLock::new(|| {
    Asset::new(
        "altcha",
        "css",
        BOT_CHECK_STYLESHEET,
        "text/css; charset=utf-8",
    )
});
static BOT_CHECK_WORKER_JS: LazyLock<Asset> = LazyLock::new(|| {
    Asset::new(
        "altcha-pbkdf2",
        "js",
        BOT_CHECK_WORKER,
        "text/javascript; charset=utf-8",
    )
});

/// The stylesheet's address, as pages link it.
pub fn stylesheet_url() -> &'static str {
    &CSS.url
}

/// The page script's address, as pages link it.
pub fn script_url() -> &'static str {
    &JS.url
}

/// The bot check's widget, its stylesheet and its worker, for the pages
/// with a door (sign-up, joining a waiting room).
pub fn bot_check_script_url() -> &'static str {
    &BOT_CHECK_JS.url
}

pub fn bot_check_stylesheet_url() -> &'static str {
    &BOT_CHECK_CSS.url
}

pub fn bot_check_worker_url() -> &'static str {
    &BOT_CHECK_WORKER_JS.url
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(stylesheet).service(script).service(hashed);
}

#[get("/static/app.css")]
pub async fn stylesheet() -> HttpResponse {
    CSS.response(BRIEFLY)
}

#[get("/static/app.js")]
pub async fn script() -> HttpResponse {
    JS.response(BRIEFLY)
}

/// A hashed address. The current content's hash is kept for a year. Another
/// hash of the same file is what a rolling deploy produces (a page from a
/// newer instance asking an older one, or the reverse): it gets this
/// instance's file, briefly cached and never as immutable, so the page is
/// styled and scripted now and the right content is fetched again soon.
#[get("/static/{file}")]
pub async fn hashed(file: web::Path<String>) -> Result<HttpResponse, AppError> {
    let path = format!("/static/{file}");
    let assets = [
        &*CSS,
        &*JS,
        &*BOT_CHECK_JS,
        &*BOT_CHECK_CSS,
        &*BOT_CHECK_WORKER_JS,
    ];
    if let Some(asset) = assets.into_iter().find(|asset| asset.url == path) {
        return Ok(asset.response(FOREVER));
    }
    let other_build = |extension: &str| {
        file.strip_prefix("app.")
            .and_then(|rest| rest.strip_suffix(extension))
            .is_some_and(|hash| hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    if other_build(".css") {
        Ok(CSS.response(BRIEFLY_NO_STORE))
    } else if other_build(".js") {
        Ok(JS.response(BRIEFLY_NO_STORE))
    } else {
        Err(AppError::NotFound(crate::error::Missing::File))
    }
}
