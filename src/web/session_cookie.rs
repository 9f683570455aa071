//! The session cookie: a few `name -> JSON` entries (the account shown in
//! the header, the session token and its expiry, the CSRF token), encrypted
//! and authenticated with the session key (AES-256-GCM, `cookie`'s private
//! jar) and kept by the browser. `carry` opens it before the handlers run
//! and writes it back only when a handler changed it; `Session` is what
//! handlers read and change.
//!
//! Opening a cookie (finding it among the request's cookies, undoing its
//! percent-encoding and base64, decrypting, parsing the JSON) cost a
//! signed-in request about half again what the shop spends on `/healthz`,
//! and a crowd's every refresh, poll and refused buy paid it. So each worker
//! thread keeps the cookies it opened lately, by their exact text: the
//! cipher is authenticated, so one text only ever opens to one set of
//! entries, and a kept copy changes nothing but the cost. Whether the
//! session behind it is still live (revoked, expired) is not the cookie's
//! to say: `session::check_session` asks on every request.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use actix_web::body::MessageBody;
use actix_web::cookie::{Cookie, CookieJar, Key, SameSite};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderValue, COOKIE, SET_COOKIE};
use actix_web::middleware::Next;
use actix_web::{web, FromRequest, HttpMessage, HttpRequest};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub const COOKIE_NAME: &str = "flashsale_session";

/// Opened cookies kept per worker thread. A few thousand covers the
/// customers a worker serves at once (a waiting room's pollers come back
/// every few seconds on the same connection); past it the thread starts
/// over rather than track ages: a miss only costs one more opening.
const KEPT_PER_THREAD: usize = 4096;

type Entries = HashMap<String, String>;
/// An opened cookie's entries, and the `SessionCookies::id` that opened it.
type Kept = (u64, Rc<Entries>);

/// How the shop seals its cookies; one per process, in app data.
#[derive(Clone)]
pub struct SessionCookies {
    key: Key,
    secure: bool,
    /// Which `SessionCookies` a kept copy was opened with: a test process
    /// runs several shops, each with its own key, on the same threads, and
    /// a text one key opened must not sign anyone in under another.
    id: u64,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl SessionCookies {
    /// `key` as `Key::from` takes it (64 bytes or more).
    pub fn new(key: &[u8], secure: bool) -> SessionCookies {
        SessionCookies {
            key: Key::from(key),
            secure,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The entries `text` (the cookie's value as the browser sent it) seals,
    /// or None for a cookie this key did not seal.
    fn open(&self, text: &str) -> Option<Entries> {
        let cookie = Cookie::parse_encoded(format!("{COOKIE_NAME}={text}")).ok()?;
        let opened = CookieJar::new()
            .private(&self.key)
            .decrypt(cookie.into_owned())?;
        serde_json::from_str(opened.value()).ok()
    }

    /// The `Set-Cookie` value that seals `entries`, and the cookie's value
    /// as the browser will send it back.
    fn seal(&self, entries: &Entries) -> anyhow::Result<(HeaderValue, String)> {
        let mut jar = CookieJar::new();
        jar.private_mut(&self.key)
            .add(self.attributes(Cookie::new(COOKIE_NAME, serde_json::to_string(entries)?)));
        let sealed = jar
            .delta()
            .next()
            .ok_or_else(|| anyhow::anyhow!("the sealed session cookie went missing"))?;
        let header = HeaderValue::from_str(&sealed.encoded().to_string())?;
        let sent_back = sealed.encoded().stripped().to_string();
        let text = sent_back
            .strip_prefix(&format!("{COOKIE_NAME}="))
            .unwrap_or(&sent_back)
            .to_string();
        Ok((header, text))
    }

    fn removal(&self) -> anyhow::Result<HeaderValue> {
        let mut removal = self.attributes(Cookie::new(COOKIE_NAME, ""));
        removal.make_removal();
        Ok(HeaderValue::from_str(&removal.to_string())?)
    }

    /// Only this site's pages send it (`SameSite=Lax`), no script reads it.
    /// No `Max-Age`: it lasts the browser session, and the session it names
    /// ends on the server by its own expiry.
    fn attributes(&self, mut cookie: Cookie<'static>) -> Cookie<'static> {
        cookie.set_path("/");
        cookie.set_http_only(true);
        cookie.set_same_site(SameSite::Lax);
        cookie.set_secure(self.secure);
        cookie
    }

    /// `text`'s entries, from this thread's kept copies or opened now.
    fn entries_of(&self, text: &str) -> Option<Rc<Entries>> {
        let kept = OPENED.with(|opened| match opened.borrow().get(text) {
            Some((id, entries)) if *id == self.id => Some(entries.clone()),
            _ => None,
        });
        if kept.is_some() {
            return kept;
        }
        let entries = Rc::new(self.open(text)?);
        self.keep(text, entries.clone());
        Some(entries)
    }

    /// Keeps `entries` as what `text` opens to: a cookie just opened, or one
    /// a response just sealed (so the browser's next request with it is no
    /// opening either).
    fn keep(&self, text: &str, entries: Rc<Entries>) {
        OPENED.with(|opened| {
            let mut opened = opened.borrow_mut();
            if opened.len() >= KEPT_PER_THREAD {
                opened.clear();
            }
            opened.insert(text.into(), (self.id, entries));
        });
    }
}

thread_local! {
    // Per thread, so a lookup takes no lock; keyed by the whole text, never
    // a part of it, so no two cookies share an entry; each copy names the
    // `SessionCookies` (the key) that opened it, and counts for no other.
    static OPENED: RefCell<HashMap<Box<str>, Kept>> = RefCell::new(HashMap::new());
}

/// What became of a request's session, for the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionStatus {
    Unchanged,
    Changed,
    /// To be dropped: the response removes the cookie.
    Purged,
    /// Sealed anew even if unchanged, so an earlier copy's text is not the
    /// one the browser holds from now on.
    Renewed,
}

struct State {
    entries: Rc<Entries>,
    status: SessionStatus,
}

/// The request's session entries. Cheap to clone; every clone is the same
/// session.
#[derive(Clone)]
pub struct Session(Rc<RefCell<State>>);

impl Session {
    fn new(entries: Rc<Entries>) -> Session {
        Session(Rc::new(RefCell::new(State {
            entries,
            status: SessionStatus::Unchanged,
        })))
    }

    pub fn get<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, serde_json::Error> {
        match self.0.borrow().entries.get(name) {
            Some(json) => serde_json::from_str(json).map(Some),
            None => Ok(None),
        }
    }

    /// Does nothing to a purged session: it is on its way out.
    pub fn insert<T: Serialize>(&self, name: &str, value: T) -> Result<(), serde_json::Error> {
        let json = serde_json::to_string(&value)?;
        let mut state = self.0.borrow_mut();
        if state.status != SessionStatus::Purged {
            Rc::make_mut(&mut state.entries).insert(name.to_string(), json);
            state.changed();
        }
        Ok(())
    }

    pub fn clear(&self) {
        let mut state = self.0.borrow_mut();
        if state.status != SessionStatus::Purged {
            state.entries = Rc::default();
            state.changed();
        }
    }

    pub fn purge(&self) {
        let mut state = self.0.borrow_mut();
        state.entries = Rc::default();
        state.status = SessionStatus::Purged;
    }

    pub fn renew(&self) {
        let mut state = self.0.borrow_mut();
        if state.status != SessionStatus::Purged {
            state.status = SessionStatus::Renewed;
        }
    }

    pub fn status(&self) -> SessionStatus {
        self.0.borrow().status
    }
}

impl State {
    /// A renewed session is sealed anew anyway.
    fn changed(&mut self) {
        if self.status == SessionStatus::Unchanged {
            self.status = SessionStatus::Changed;
        }
    }
}

impl FromRequest for Session {
    type Error = actix_web::Error;
    type Future = std::future::Ready<Result<Session, actix_web::Error>>;

    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        std::future::ready(Ok(session_of(req)))
    }
}

/// The session `carry` opened for `req` (an empty one outside it).
pub fn session_of(req: &HttpRequest) -> Session {
    if let Some(session) = req.extensions().get::<Session>() {
        return session.clone();
    }
    let session = Session::new(Rc::default());
    req.extensions_mut().insert(session.clone());
    session
}

/// The session cookie's text in `req`: the first `flashsale_session` of
/// its `Cookie` headers, as actix's own cookie lookup picks it. Only the
/// first: a request pays at most one opening whatever it sends. A stray
/// copy a browser sends first (one set for a narrower path by someone
/// else) hides the shop's own, as it did under actix-session; the shop
/// sets its cookie only for `/`.
fn cookie_text(req: &ServiceRequest) -> Option<&str> {
    req.headers()
        .get_all(COOKIE)
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE_NAME)?.strip_prefix('='))
}

/// Middleware: opens the session cookie before the handlers and seals what
/// they changed after.
pub async fn carry(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let cookies = req
        .app_data::<web::Data<SessionCookies>>()
        .cloned()
        .ok_or_else(|| actix_web::error::ErrorInternalServerError("no SessionCookies"))?;
    let opened = cookie_text(&req).and_then(|text| cookies.entries_of(text));
    let had_cookie = opened.is_some();
    let session = Session::new(opened.unwrap_or_default());
    req.extensions_mut().insert(session.clone());

    let mut res = next.call(req).await?;

    let (status, entries) = {
        let state = session.0.borrow();
        (state.status, state.entries.clone())
    };
    let set_cookie = match status {
        SessionStatus::Unchanged if had_cookie || entries.is_empty() => None,
        SessionStatus::Purged if !had_cookie => None,
        SessionStatus::Purged => Some(cookies.removal()),
        // Emptied: nothing is left to keep, so the browser drops it too.
        _ if entries.is_empty() => had_cookie.then(|| cookies.removal()),
        _ => Some(cookies.seal(&entries).map(|(header, text)| {
            cookies.keep(&text, entries.clone());
            header
        })),
    };
    if let Some(header) = set_cookie {
        let header = header.map_err(actix_web::error::ErrorInternalServerError)?;
        res.headers_mut().append(SET_COOKIE, header);
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cookies() -> SessionCookies {
        SessionCookies::new(&[7u8; 64], false)
    }

    fn entries(pairs: &[(&str, &str)]) -> Entries {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_sealed_cookie_opens_to_its_entries_and_only_with_its_key() {
        let sealed = entries(&[("csrf", "\"abc\""), ("account", "{\"id\":1}")]);
        let (header, text) = cookies().seal(&sealed).unwrap();
        let header = header.to_str().unwrap();
        assert!(header.starts_with(&format!("{COOKIE_NAME}={text}")));
        assert!(header.contains("HttpOnly") && header.contains("SameSite=Lax"));
        assert!(
            !header.contains("abc"),
            "the entries are not readable: {header}"
        );
        assert_eq!(cookies().open(&text), Some(sealed));
        assert_eq!(SessionCookies::new(&[8u8; 64], false).open(&text), None);
    }

    #[test]
    fn a_changed_cookie_opens_to_nothing_even_after_the_original_was_kept() {
        let cookies = cookies();
        let (_, text) = cookies.seal(&entries(&[("csrf", "\"abc\"")])).unwrap();
        assert!(cookies.entries_of(&text).is_some());
        let mut forged = text.clone().into_bytes();
        let last = forged.len() - 3;
        forged[last] = if forged[last] == b'A' { b'B' } else { b'A' };
        let forged = String::from_utf8(forged).unwrap();
        assert_eq!(cookies.entries_of(&forged), None);
        assert_eq!(cookies.entries_of(&text[..text.len() - 1]), None);
    }

    #[test]
    fn a_copy_kept_under_one_key_opens_nothing_under_another() {
        let one = cookies();
        let (_, text) = one.seal(&entries(&[("csrf", "\"abc\"")])).unwrap();
        assert!(one.entries_of(&text).is_some(), "kept on this thread now");
        let other = SessionCookies::new(&[8u8; 64], false);
        assert_eq!(other.entries_of(&text), None);
        // Nor does a second `SessionCookies` of the same key see the first's
        // copies: it opens the text itself.
        assert!(cookies().entries_of(&text).is_some());
    }

    #[test]
    fn sealing_twice_gives_two_texts_of_the_same_entries() {
        let cookies = cookies();
        let sealed = entries(&[("csrf", "\"abc\"")]);
        let (_, first) = cookies.seal(&sealed).unwrap();
        let (_, second) = cookies.seal(&sealed).unwrap();
        assert_ne!(first, second, "each sealing has its own nonce");
        assert_eq!(cookies.entries_of(&first).as_deref(), Some(&sealed));
        assert_eq!(cookies.entries_of(&second).as_deref(), Some(&sealed));
    }

    #[test]
    fn a_session_reports_what_became_of_it() {
        let session = Session::new(Rc::new(entries(&[("csrf", "\"abc\"")])));
        assert_eq!(
            session.get::<String>("csrf").unwrap().as_deref(),
            Some("abc")
        );
        assert_eq!(session.status(), SessionStatus::Unchanged);
        session.insert("csrf", "def").unwrap();
        assert_eq!(session.status(), SessionStatus::Changed);
        session.renew();
        assert_eq!(session.status(), SessionStatus::Renewed);
        session.insert("csrf", "ghi").unwrap();
        assert_eq!(session.status(), SessionStatus::Renewed);
        session.purge();
        session.insert("csrf", "jkl").unwrap();
        assert_eq!(session.status(), SessionStatus::Purged);
        assert_eq!(session.get::<String>("csrf").unwrap(), None);
        session.renew();
        assert_eq!(session.status(), SessionStatus::Purged);
    }
}
