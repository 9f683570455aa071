//! The stylesheet and the page script, compiled into the binary and served
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

/// A year: the longest `max-age` caches honour.
const FOREVER: &str = "public, max-age=31536000, immutable";
/// The unversioned addresses may change under the same name.
const BRIEFLY: &str = "public, max-age=300";

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

/// The stylesheet's address, as pages link it.
pub fn stylesheet_url() -> &'static str {
    &CSS.url
}

/// The page script's address, as pages link it.
pub fn script_url() -> &'static str {
    &JS.url
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

/// A hashed address: only the current content's hash answers, so an old
/// page's stale hash is a 404, never old content cached as new.
#[get("/static/{file}")]
pub async fn hashed(file: web::Path<String>) -> Result<HttpResponse, AppError> {
    let path = format!("/static/{file}");
    [&*CSS, &*JS]
        .into_iter()
        .find(|asset| asset.url == path)
        .map(|asset| asset.response(FOREVER))
        .ok_or_else(|| AppError::NotFound("There is no file at this address.".into()))
}
